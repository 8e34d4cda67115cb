"""vLLM's own root-cause line in a failed `vllm serve` log: the last specific exception (or pydantic
validation error), past wrappers such as "Engine core initialization failed". Pure."""
from __future__ import annotations

import re
from typing import Mapping

from bootstrap.signatures.engine import MAX_EVIDENCE, mask_secrets, normalize

#: What vLLM, Ray, torch.distributed and log collectors put before a line's own text, one at a time (they
#: nest: "(EngineCore_DP0 pid=9) (RayWorkerWrapper pid=5, ip=10.0.0.2) ERROR 11-21 02:34:44 [core.py:1] ").
#: Exactly one space after each is dropped, so a traceback line keeps its own indentation.
_LINE_PREFIX = re.compile(
    r"\([^()\n]*\bpid=\d+[^()\n]*\) ?"  # (APIServer pid=1), (Worker_TP0 pid=6), (RayWorkerWrapper pid=5, ip=..)
    r"|\[rank\d+\]: ?"  # torch.distributed
    r"|(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? (?:\[[^\]\n]*\]|\S+\]) ?"
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)? (?:(?:stdout|stderr) [FP] )?"  # docker, CRI
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[,.]\d+)? \| \w+ \| \w+ \| ?")  # "2024-01-22 14:32:27 | ERROR | stderr | "
#: The last line of a traceback: `ValueError: ...`, `torch.distributed.DistBackendError: ...`,
#: `ray.exceptions.RayTaskError(KeyError): ...`, or a bare `AssertionError`.
_EXC_LINE = re.compile(r"(?P<name>(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure|Fault)"
                       r"|Exception))(?:\([\w.]+\))?(?::(?P<msg>.*))?")
#: A pydantic error under `ValidationError: 1 validation error for VllmConfig` (vLLM's configs are pydantic
#: dataclasses): `  Value error, <the message> [type=value_error, input_value=ArgsKwargs(...), ...]`.
_PYDANTIC_DETAIL = re.compile(r"\s+(?P<msg>\S.*?)\s*\[type=[\w.]+[,\]].*"
                              r"|\s*(?P<bare>(?:Value error|Assertion failed), \S.*)")
_PYDANTIC_LOC = re.compile(r"[A-Za-z_][\w.\[\]]*")
#: Substrings a line needs before the regexes above are tried (logs are large, most lines are neither).
_EXC_HINT = re.compile(r"Error|Exception|Exit|Interrupt|Failure|Fault|\[type=|Value error|Assertion failed")
#: Exceptions that only point elsewhere ("See root cause above") or come from shutting down.
_WRAPPER = re.compile(r"root cause|see (?:the )?stack trace|^\d+ validation errors? for \w+$|^ray::"
                      r"|likely shutting down", re.IGNORECASE)
_WRAPPER_NAMES = ("SystemExit", "KeyboardInterrupt", "CancelledError")


def _strip_prefixes(line: str) -> str:
    while m := _LINE_PREFIX.match(line):
        line = line[m.end():]
    return line


def _cut(text: str) -> str:
    flat = " ".join(mask_secrets(text).split())
    return flat if len(flat) <= MAX_EVIDENCE else flat[:MAX_EVIDENCE - 1] + "…"


def _exception_at(lines: list[str], i: int) -> tuple[str, bool] | None:
    """(message, is a wrapper) when line i ends a traceback or is a pydantic error; None otherwise."""
    line = _strip_prefixes(lines[i])
    prev = _strip_prefixes(lines[i - 1]) if i else ""
    if m := _PYDANTIC_DETAIL.fullmatch(line.rstrip()):
        msg = (m["msg"] or m["bare"]).split(" [type=")[0].strip()
        loc = prev.strip() if _PYDANTIC_LOC.fullmatch(prev) and not _EXC_LINE.fullmatch(prev) else ""
        return (f"{loc}: {msg}" if loc else msg), False
    m = _EXC_LINE.fullmatch(line.rstrip())
    if not m:
        return None
    name, msg = m["name"], (m["msg"] or "").strip()
    wrapper = name.rsplit(".", 1)[-1] in _WRAPPER_NAMES or bool(_WRAPPER.search(msg))
    if msg:
        return line.strip(), wrapper
    j = i - 1
    while j >= 0 and _strip_prefixes(lines[j]).strip() and not _strip_prefixes(lines[j]).strip("^~ "):
        j -= 1  # Python 3.11+ marks the failing expression with ^^^ under the code line
    code = _strip_prefixes(lines[j]) if j >= 0 else ""
    if not code[:1].isspace() or not code.strip():  # a bare name counts only under a traceback's code line
        return None
    return f"{name} at `{code.strip()}`", wrapper


def root_cause(log_text: str) -> str | None:
    """vLLM's own root-cause line in a log, or None when the log holds no exception.

    The log may interleave processes and nodes, with vLLM's, Ray's and torch's line prefixes and ANSI
    colours. The answer is the last exception that is not a mere wrapper: vLLM's front end ends the log
    with `RuntimeError: Engine core initialization failed. See root cause above.` and the like, so the
    specific error before it is the cause. A pydantic validation error gives its detail line (`Value
    error, ...` without the `[type=...]` tail), a bare `AssertionError` the code line it failed on. One
    line, tokens masked, at most MAX_EVIDENCE characters.
    """
    text = normalize(log_text)
    lines = text.split("\n")
    wrapper: str | None = None
    for i in range(len(lines) - 1, -1, -1):
        if not _EXC_HINT.search(lines[i]):
            continue
        found = _exception_at(lines, i)
        if found is None:
            continue
        msg, is_wrapper = found
        if not is_wrapper:
            return _cut(msg)
        wrapper = wrapper or msg
    if wrapper:
        return _cut(wrapper)
    # No exception: the command line itself was refused (argparse's `vllm: error: ...`).
    usage = [ln for ln in lines if _USAGE_ERROR.match(ln.strip())]
    return _cut(usage[-1].strip()) if usage else None


_USAGE_ERROR = re.compile(r"^vllm(?: serve)?: error: \S")


def root_cause_of(tails: Mapping[str, str]) -> str | None:
    """vLLM's root-cause line (root_cause) in several nodes' logs, host -> text, the head's first:
    the first found, with the node named when it came from another node than the first."""
    for host, text in tails.items():
        found = root_cause(text)
        if found:
            return found if host == next(iter(tails)) else f"{host}: {found}"
    return None
