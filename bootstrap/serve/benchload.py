"""The workload of a load test and the timing of one streamed answer (pure): the configuration, request, SSE lines.

`BenchConfig` says what to send (checked when made), `request_body` is the request, and
`parse_sse_line` and `StreamTimer` read the answer's lines with the times the caller passes; the
unit tests drive them with real vLLM stream lines. bench.py sends the requests.


What is measured, per request (all on the `clock` passed to `run_bench`):

* the request is `POST {url}/v1/completions` with `"stream": true` and
  `"stream_options": {"include_usage": true}`; the answer is server-sent events, one
  `data: {json}` line per chunk, then `data: [DONE]`;
* TTFT: from just before the connection is opened to the first chunk whose `text` is non-empty;
* ITL (inter-token latency): the gaps between successive chunks with non-empty text. vLLM sends
  one chunk per engine step; a chunk with empty text (the detokenizer holding back an incomplete
  UTF-8 sequence) is not content, so the gap around it spans two tokens. Times are taken when a
  line is read on the client, so chunks that arrive in one TCP read get near-zero gaps;
* E2E: from just before the connection is opened to `[DONE]`;
* output tokens: `usage.completion_tokens` from the final usage chunk when the server sends one,
  else the number of chunks with non-empty text.
"""
from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from bootstrap.errors import UsageError
from bootstrap.serve.benchstats import Sample
from bootstrap.signatures.engine import URL_PASSWORD

DEFAULT_PROMPT = (
    "A cluster is a set of machines that work together as one. Explain in a few sentences how a "
    "model server spreads one large model over several machines."
)

#: An error keeps this many characters of the response body.
ERROR_BODY_CHARS = 200
#: The most tokens one request may ask for (max_tokens): 2**20, beyond the longest context a served model
#: has; more is a typo, which every request would spend minutes on or vLLM refuse one by one.
MAX_TOKENS = 1 << 20


# -- configuration -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchConfig:
    #: Base URL of the OpenAI-compatible server, e.g. http://10.0.0.1:8000 (a trailing /v1 is fine).
    url: str
    #: Model name to request; None: the first id that GET /v1/models lists.
    model: str | None = None
    requests: int = 64
    concurrency: int = 8
    prompt: str = DEFAULT_PROMPT
    max_tokens: int = 64
    #: Seconds one request may take, connect to [DONE]; also the /v1/models timeout.
    timeout: float = 120
    temperature: float = 0.0
    #: Send vLLM's `ignore_eos: true` so every request generates exactly max_tokens tokens.
    ignore_eos: bool = False
    #: sent as `Authorization: Bearer ...` (the secret cluster.router.api_key names); never shown
    api_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.requests, int) or self.requests < 1:
            raise UsageError(f"bench: requests must be an integer >= 1 (got {self.requests!r})")
        if not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise UsageError(f"bench: concurrency must be an integer >= 1 (got {self.concurrency!r})")
        if not isinstance(self.max_tokens, int) or not 1 <= self.max_tokens <= MAX_TOKENS:
            raise UsageError(f"bench: max_tokens must be an integer from 1 to {MAX_TOKENS} (got {self.max_tokens!r})")
        if not self.timeout > 0:
            raise UsageError(f"bench: timeout must be > 0 seconds (got {self.timeout!r})")
        split_url(self.url)  # raises UsageError on a bad URL



def request_body(cfg: BenchConfig, model: str, prompt: str | None = None,
                 max_tokens: int | None = None) -> dict[str, Any]:
    """The streamed completion; prompt and max_tokens: this request's own (a workload's), else cfg's."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": cfg.prompt if prompt is None else prompt,
        "max_tokens": cfg.max_tokens if max_tokens is None else max_tokens,
        "temperature": cfg.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    return body



def split_url(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, base path without a trailing / or /v1) of a server URL.

    A UsageError for anything else: no http(s) scheme or host, a space or control character
    (urlsplit would silently drop a newline), a broken IPv6 bracket, a port outside 1-65535."""
    text = url.strip()
    url = URL_PASSWORD.sub(r"\1***@", url)  # never echoed with its password
    bad = f"bench: the URL must look like http://HOST:PORT (got {url!r})"
    if not text.isprintable() or " " in text:
        raise UsageError(f"{bad}: no spaces or control characters")
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError as exc:  # Invalid IPv6 URL
        raise UsageError(f"{bad}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(bad)
    if parts.username is not None or parts.password is not None:
        raise UsageError(f"bench: the URL carries a user or a password ({url!r}): bench would not send them, and on "
                         "a command line they are in ps and your shell's history; the fleet's API key is read from "
                         "the secret cluster.router.api_key names")
    try:
        port = parts.port
    except ValueError as exc:
        raise UsageError(f"bench: bad port in {url!r}: {exc}") from None
    if port == 0:
        raise UsageError(f"bench: bad port in {url!r}: 0 (a port is 1-65535)")
    port = port or (443 if parts.scheme == "https" else 80)
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return parts.scheme, parts.hostname, port, path


# -- server-sent events --------------------------------------------------------------------------

#: What parse_sse_line returns for `data: [DONE]`.
DONE = "[DONE]"


def parse_sse_line(line: str | bytes) -> dict[str, Any] | str | None:
    """One line of an SSE stream: its JSON object for `data: {...}`, DONE for `data: [DONE]`,
    None for anything else (blank separator lines, comments, `event:`/`id:` fields).

    Raises ValueError when a data line is not JSON.
    """
    if isinstance(line, bytes):
        line = line.decode("utf-8", "replace")
    line = line.rstrip("\r\n")
    if not line.startswith("data:"):
        return None
    payload = line[5:]
    if payload.startswith(" "):
        payload = payload[1:]
    if payload.strip() == DONE:
        return DONE
    if not payload.strip():
        return None
    obj = json.loads(payload)
    if not isinstance(obj, dict):
        raise ValueError(f"SSE data is not a JSON object: {payload[:ERROR_BODY_CHARS]}")
    return obj


def _chunk_error(obj: dict[str, Any]) -> str | None:
    """The error an SSE chunk reports: {"error": {...}} (vLLM, OpenAI) or {"object": "error", ...}."""
    err = obj.get("error")
    if err:
        if isinstance(err, dict):
            msg = err.get("message") or json.dumps(err)
            code = err.get("code")
            return f"stream error{f' {code}' if code is not None else ''}: {msg}"
        return f"stream error: {err}"
    if obj.get("object") == "error":
        code = obj.get("code")
        return f"stream error{f' {code}' if code is not None else ''}: {obj.get('message', '')}"
    return None


def _chunk_text(obj: dict[str, Any]) -> str:
    parts = []
    for choice in obj.get("choices") or ():
        if isinstance(choice, dict):
            text = choice.get("text")
            if text is None and isinstance(choice.get("delta"), dict):  # chat-style chunk
                text = choice["delta"].get("content")
            if isinstance(text, str):
                parts.append(text)
    return "".join(parts)


class StreamTimer:
    """Times one streamed completion from its SSE lines (pure: the caller passes the times).

    `StreamTimer(start)`, then `feed(line, now)` for every line received, then `sample(end)`.
    """

    def __init__(self, start: float):
        self.start = start
        self.first: float | None = None
        self.last: float | None = None
        self.gaps: list[float] = []
        self.chunks = 0
        self.usage_tokens: int | None = None
        self.done = False
        self.error: str | None = None

    def feed(self, line: str | bytes, now: float) -> None:
        if self.done or self.error:
            return
        try:
            obj = parse_sse_line(line)
        except ValueError as exc:
            text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
            self.error = f"bad stream line ({exc}): {text.strip()[:ERROR_BODY_CHARS]}"
            return
        if obj is None:
            return
        if obj == DONE:
            self.done = True
            return
        assert isinstance(obj, dict)
        err = _chunk_error(obj)
        if err:
            self.error = err[:ERROR_BODY_CHARS + 40]
            return
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
        if _chunk_text(obj):
            if self.first is None:
                self.first = now
            else:
                self.gaps.append(now - self.last)  # type: ignore[operator]
            self.last = now
            self.chunks += 1

    def sample(self, end: float, error: str | None = None) -> Sample:
        """The finished request; `error` (transport trouble) overrides what the stream said."""
        error = error or self.error
        if error is None and not self.done:
            error = "stream ended before data: [DONE]"
        tokens = self.usage_tokens if self.usage_tokens is not None else self.chunks
        return Sample(
            ok=error is None,
            ttft=None if self.first is None else self.first - self.start,
            itl=tuple(self.gaps),
            e2e=end - self.start,
            output_tokens=tokens,
            error=error,
            started=self.start,
        )
