"""What a policy A/B sends (pure): the built-in workloads and a trace file, as a list of requests.

Each workload is built from a seed, so every arm of an A/B (each router policy, each repeat) sends
the very same prompts in the same order:

* `shared-prefix`: one long system prompt shared by every request, then one of many users' own
  question (the users take turns); a cache-aware router can keep the prefix on one replica;
* `multi-turn`: chat sessions whose every turn repeats the conversation so far and adds to it; the
  sessions' first turns go first, then their second turns...; each request names its session
  (`X-Session-ID`), which session-sticky policies route by;
* `few-shot`: a long block of worked examples common to every request, then a question;
* `random`: prompts of the same length with no common prefix: the control, where no policy can win
  by the cache.

A trace file is JSON lines: `{"timestamp": seconds, "prompt": text | "prompt_tokens": n,
"output_tokens": n, "session": id}` (timestamp and session optional); requests are sent at their
timestamps (relative to the first), at most --concurrency in flight.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from bootstrap.errors import UsageError

WORKLOADS = ("shared-prefix", "multi-turn", "few-shot", "random")

#: The words prompts are made of: plain English, short enough for any tokenizer to keep most whole.
_WORDS = tuple("""the a model server cluster node machine request answer token cache prefix user session turn
question example system prompt router replica engine memory network card batch queue stream time fast slow
large small first last every other same new old good best simple short long plain clear one two three four
five six seven eight nine ten is are was were be can will would should may must has have had do does did
make take give keep send read write start stop run wait show tell ask say find know see use work serve
route split share hold move""".split())

#: Users of the shared-prefix workload, sessions of the multi-turn one, and turns per session.
USERS = 16
SESSIONS = 8
TURNS = 4


@dataclass(frozen=True)
class Req:
    prompt: str
    #: max_tokens of this request (None: the bench's --max-tokens)
    max_tokens: int | None = None
    #: sent as X-Session-ID (the session or user); None: no header
    session: str | None = None
    #: seconds after the start to send it (a trace); None: as soon as a slot is free
    at: float | None = None


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, n)))


def build(name: str, requests: int, prompt_words: int, seed: int = 0) -> list[Req]:
    """`requests` requests of the workload `name`, each prompt about `prompt_words` words long."""
    rng = random.Random(f"{name}:{seed}")
    if name == "shared-prefix":
        system = _words(rng, prompt_words * 3 // 4)
        asks = [_words(rng, max(1, prompt_words // 4)) for _ in range(USERS)]
        return [Req(f"{system}\nuser {i % USERS}: {asks[i % USERS]}", session=f"user-{i % USERS}")
                for i in range(requests)]
    if name == "few-shot":
        shots = _words(rng, prompt_words * 7 // 8)
        return [Req(f"{shots}\nQ: {_words(rng, max(1, prompt_words // 8))}\nA:") for _ in range(requests)]
    if name == "multi-turn":
        step = max(1, prompt_words // TURNS)
        chats = [[_words(rng, step) for _ in range(TURNS)] for _ in range(SESSIONS)]
        out = []
        for i in range(requests):
            turn, s = divmod(i, SESSIONS)
            turn %= TURNS
            said = "\n".join(f"user: {chats[s][t]}\nassistant: ok" for t in range(turn))
            out.append(Req(f"{said}\nuser: {chats[s][turn]}\nassistant:".lstrip("\n"), session=f"session-{s}"))
        return out
    if name == "random":
        return [Req(_words(rng, prompt_words)) for _ in range(requests)]
    raise UsageError(f"bench: no workload {name!r} (one of: {', '.join(WORKLOADS)})")


def _field(path: str, n: int, doc: dict, key: str, kind: type, low: float = 0):
    v = doc.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, kind) and not (kind is float and isinstance(v, int)) or v < low:
        raise UsageError(f"{path}:{n}: {key} must be a {'number' if kind is float else 'whole number'} "
                         f">= {low:g} (got {v!r})")
    return v


def read_trace(path: str, default_session: str | None = None) -> list[Req]:
    """The requests of a JSON-lines trace; UsageError naming the file and line of the first bad one."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"bench: cannot read the trace {path}: {exc}") from None
    out: list[Req] = []
    t0 = None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError as exc:
            raise UsageError(f"{path}:{n}: not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise UsageError(f"{path}:{n}: each line is a JSON object (got {type(doc).__name__})")
        prompt, count = doc.get("prompt"), _field(path, n, doc, "prompt_tokens", int, 1)
        if (prompt is None) == (count is None):
            raise UsageError(f"{path}:{n}: give either prompt (text) or prompt_tokens (a count)")
        if prompt is not None and (not isinstance(prompt, str) or not prompt):
            raise UsageError(f"{path}:{n}: prompt must be a non-empty string")
        ts = _field(path, n, doc, "timestamp", float)
        t0 = ts if t0 is None and ts is not None else t0
        session = doc.get("session", default_session)
        if session is not None and not isinstance(session, (str, int)):
            raise UsageError(f"{path}:{n}: session must be a string (got {session!r})")
        out.append(Req(prompt if prompt is not None else _words(random.Random(n), count),
                       _field(path, n, doc, "output_tokens", int, 1),
                       None if session is None else str(session),
                       None if ts is None else max(0.0, ts - (t0 or 0.0))))
    if not out:
        raise UsageError(f"bench: the trace {path} has no requests")
    return out
