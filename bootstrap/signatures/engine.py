"""The matching engine: what a signature is, and how a log is matched against a table of them.

A signature (`Signature`) is data: an id, a severity, the patterns of the lines that show it, a cause
and a fix. `scan` runs one table over one log; the table itself lives in the data modules beside this
one (ray.py, nccl.py, ...), assembled by the package as `SIGNATURES`. Pure: nothing here touches a host.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

SEVERITIES = ("error", "warning", "info")
_RANK = {s: i for i, s in enumerate(SEVERITIES)}
#: Longest evidence string; longer lines are cut to a window around the match.
MAX_EVIDENCE = 300


@dataclass(frozen=True)
class Finding:
    id: str
    #: "error" | "warning" | "info"
    severity: str
    #: The host it was seen on; None: cluster-wide.
    host: str | None
    #: One line: the cause.
    title: str
    #: The log line or the values seen: one line, at most MAX_EVIDENCE characters, tokens masked.
    evidence: str
    #: What to do: flags, variables, commands.
    fix: str
    #: The log it was seen in (doctor/logsources.SOURCES: node, vllm, keeper, router, prometheus); None:
    #: not from a log (a check of values gathered from the hosts).
    source: str | None = None


@dataclass(frozen=True)
class Pattern:
    regex: re.Pattern
    #: Overrides the signature's severity for lines this pattern matches (None: the signature's).
    severity: str | None = None
    #: Lower-case text every match contains: lines without it are never handed to the regex.
    needle: str = ""


@dataclass(frozen=True)
class Signature:
    id: str
    severity: str
    patterns: tuple[Pattern, ...]
    title: str
    fix: str
    #: A context flag `scan_log` must have set for this signature to apply ("infiniband").
    requires: str | None = None
    #: Lines matching this are never evidence for this signature.
    ignore: re.Pattern | None = None
    #: Ids of causes that explain this symptom: when one is found on the same host, this one is dropped.
    suppressed_by: tuple[str, ...] = ()
    #: Where the message text was taken from (issues, source files).
    sources: tuple[str, ...] = ()
    #: Builds the fix from the evidence line, when the fix depends on what the line names.
    fix_for: Callable[[str], str] | None = field(default=None, compare=False, repr=False)


def fix_from(regex: re.Pattern, default: str, build: Callable[[re.Match], str]) -> Callable[[str], str]:
    """A `Signature.fix_for`: the fix built from what `regex` finds in the evidence line, else `default`."""
    def fix(line: str) -> str:
        m = regex.search(line)
        return build(m) if m else default
    return fix


def pattern(regex: str, severity: str | None = None, *, needle: str | None = None) -> Pattern:
    """A case-insensitive, multi-line `Pattern`. A regex with special characters needs a literal
    `needle` (a substring every match contains); a plain string is its own needle."""
    if needle is None:
        if set(regex) & set("\\.^$*+?{}[]|()"):
            raise ValueError(f"pattern {regex!r} needs a literal needle")
        needle = regex
    return Pattern(re.compile(regex, re.IGNORECASE | re.MULTILINE), severity, needle.lower())


#: The password of a URL's user information (`scheme://user:PASSWORD@`), in group 1 what precedes it.
URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)(?!\*\*\*@)[^/\s@]+@")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SECRETS = (
    (re.compile(r"hf_[A-Za-z0-9]{20,}"), "hf_***"),
    # a password in a URL (a proxy's, a registry's): user:***@
    (URL_PASSWORD, r"\1***@"),
    (re.compile(r"((?:HF_TOKEN|HUGGING_FACE_HUB_TOKEN|HUGGINGFACE_TOKEN|HF_API_TOKEN)\s*[=:]\s*)"
                r"(?!\*\*\*)[\"']?[^\s\"',]+[\"']?"), r"\1***"),
)


def mask_secrets(text: str) -> str:
    for regex, repl in _SECRETS:
        text = regex.sub(repl, text)
    return text


def one_line(text: str, at: int = 0) -> str:
    """Mask, collapse whitespace, and cut to MAX_EVIDENCE characters keeping offset `at` in view.

    Masking comes first, so a cut can never leave part of a token readable.
    """
    head = len(" ".join(mask_secrets(text[:at]).split()))
    flat = " ".join(mask_secrets(text).split())
    if len(flat) <= MAX_EVIDENCE:
        return flat
    start = max(0, min(head - 80, len(flat) - (MAX_EVIDENCE - 2)))
    cut = flat[start:start + MAX_EVIDENCE - 2]
    return ("…" if start else "") + cut + ("…" if start + len(cut) < len(flat) else "")


def normalize(text: str) -> str:
    """The text without ANSI colour codes, its line ends (CR LF, CR) made LF."""
    return _ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n")


def _finding(sig: Signature, host: str | None, severity: str, line: str, at: int) -> Finding:
    evidence = one_line(line, at)
    fix = sig.fix_for(line) if sig.fix_for else sig.fix
    return Finding(sig.id, severity, host, sig.title, evidence, fix)


def _first_match(sig: Signature, pat: Pattern, text: str, low: str) -> tuple[int, int, int] | None:
    """(line start, match offset in the line, line end) of the first line where `pat` matches.

    Finds candidate lines by the pattern's needle in the lower-cased text (a plain substring search),
    and runs the regex on those lines only: logs are large and most lines match nothing.
    """
    pos = low.find(pat.needle)
    while pos >= 0:
        start = text.rfind("\n", 0, pos) + 1
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        m = pat.regex.search(text, start, end)
        if m and (sig.ignore is None or not sig.ignore.search(text, start, end)):
            return start, m.start() - start, end
        pos = low.find(pat.needle, end)
    return None


_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


def _lower(text: str) -> str:
    """Lower-cased text with the same offsets (str.lower can lengthen some non-ASCII characters)."""
    low = text.lower()
    return low if len(low) == len(text) else text.translate(_ASCII_LOWER)


def scan(table: Sequence[Signature], host: str | None, text: str, *, infiniband: bool = False) -> list[Finding]:
    """Findings for the signatures of `table` in `text`, one per signature, ordered by severity.

    The evidence is the first line that matched; the severity is the highest any matching line
    carries (a Gloo loopback warning followed by connectFullMesh failing is an error). `infiniband`
    says InfiniBand is configured for the cluster, which turns NCCL's socket fallback into a finding.
    A symptom is dropped when a signature naming its cause is found too (`Signature.suppressed_by`).
    """
    flags = {"infiniband": infiniband}
    text = normalize(text)
    low = _lower(text)
    hits: dict[str, tuple[Signature, str, tuple[int, int, int]]] = {}  # id -> (sig, severity, first line)
    for sig in table:
        if sig.requires is not None and not flags.get(sig.requires):
            continue
        for pat in sig.patterns:
            where = _first_match(sig, pat, text, low)
            if where is None:
                continue
            sev = pat.severity or sig.severity
            if sig.id not in hits:
                hits[sig.id] = (sig, sev, where)
            else:
                _, worst, first = hits[sig.id]
                hits[sig.id] = (sig, sev if _RANK[sev] < _RANK[worst] else worst, min(first, where))
    out = []
    for sig, sev, (start, at, end) in hits.values():
        if not any(cause in hits for cause in sig.suppressed_by):
            out.append(_finding(sig, host, sev, text[start:end], at))
    return sort_findings(out)


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Errors first, then by host (cluster-wide findings before per-host ones), then by id."""
    return sorted(findings, key=lambda f: (_RANK.get(f.severity, len(SEVERITIES)),
                                           f.host is not None, f.host or "", f.id))
