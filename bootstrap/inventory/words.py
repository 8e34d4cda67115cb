"""How an inventory error writes a value the user gave: on one printable line, quoted and bounded
(shared by the YAML reader, its syntax messages and the field checks)."""
from __future__ import annotations


def _one_line(text: str) -> str:
    """The text with every character that is not printable (newlines, tabs, NUL, ESC ...) written
    as in a Python string literal, so that an error is one line a terminal shows as it is."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def _quote(text: str, limit: int = 60) -> str:
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return repr(text)
