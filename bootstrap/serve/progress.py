"""What vLLM is doing while `serve` waits for it, read from its own log (pure).

vLLM (V1, 0.32) logs each step of its start; `serve` polls the tail of the log and reports the
newest step it recognizes, so a load of many minutes (a first download, a 405B model's shards, a
torch.compile) is never a silent wait. The steps, in the order vLLM takes them, with the lines
that mark them (their sources in vLLM: entrypoints, v1/engine/core.py, v1/worker/*_model_runner.py,
model_executor/model_loader/*, compilation/backends.py, v1/core/kv_cache_utils.py):

    starting        no output yet: the Python process imports vLLM and torch
    config          "non-default args", "Resolved architecture: X"
    workers         "world_size=N rank=R ... distributed_init_method" (the ranks connect)
    loading         "Starting to load model X..." (a hub model is downloaded here: vLLM logs no
                    progress of it, only "Time spent downloading weights" after)
    shards          "Loading safetensors checkpoint shards:  49% Completed | 94/191 [08:33<15:40, ...]"
    loaded          "Loading weights took S seconds", "Model loading took G GiB memory and S seconds"
    compiling       "Dynamo bytecode transform time", "Compiling a graph for ...", "Directly load the compiled"
    kv-cache        "GPU KV cache size: N tokens" / "CPU KV cache size: ..."
    cuda-graphs     "Capturing CUDA graphs", "Graph capturing finished in S secs"
    engine-ready    "init engine (profile, create kv cache, warmup model) took S s"
    api-server      "Starting vLLM server on URL"

The I/O (the polling thread) is in serve/watch.py.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

#: Seconds between two reports of the same step (a heartbeat with the time in it).
HEARTBEAT_S = 30.0
#: Seconds between two reports of a step whose detail moves (the shards' percentage).
MOVING_S = 10.0


@dataclass(frozen=True)
class Step:
    """One step of vLLM's start: its name, its place in the order, and what to say of it."""

    name: str
    order: int
    text: str


def _shards(m: re.Match) -> str:
    left = f", {m['left']} left" if m["left"] and m["left"] != "?" else ""
    return f"loading the weights: {m['done']}/{m['total']} checkpoint shards ({m['pct']}%){left}"


_STEPS: tuple[tuple[str, re.Pattern, object], ...] = (
    ("config", re.compile(r"Resolved architecture: (?P<arch>\S+)"), lambda m: f"resolved the model: {m['arch']}"),
    ("config", re.compile(r"non-default args: "), "read the arguments"),
    ("workers", re.compile(r"world_size=(?P<n>\d+) rank=\d+ .*distributed_init_method"),
     lambda m: f"connecting the {m['n']} ranks"),
    ("loading", re.compile(r"Starting to load model (?P<model>\S+?)\.\.\."),
     lambda m: f"loading {m['model']} (a hub model downloads here first; vLLM logs no progress of that)"),
    ("shards", re.compile(r"Loading \S+ checkpoint shards:\s+(?P<pct>\d+)% Completed \| (?P<done>\d+)/(?P<total>\d+)"
                          r"(?: \[[^<\]]*<(?P<left>[^,\]]*))?"), _shards),
    ("loaded", re.compile(r"Model loading took (?P<gib>[\d.]+) GiB memory and (?P<s>[\d.]+) seconds"),
     lambda m: f"weights loaded: {float(m['gib']):.1f} GiB in {float(m['s']):.1f} s"),
    ("loaded", re.compile(r"Loading weights took (?P<s>[\d.]+) seconds"),
     lambda m: f"weights loaded in {float(m['s']):.1f} s"),
    ("compiling", re.compile(r"Dynamo bytecode transform time|Compiling a graph for|Directly load the compiled"),
     "torch.compile (the first start of a model compiles; later ones read the cache)"),
    ("kv-cache", re.compile(r"(?P<dev>GPU|CPU) KV cache size: (?P<tokens>[\d,]+) tokens"),
     lambda m: f"KV cache: {m['tokens']} tokens"),
    ("cuda-graphs", re.compile(r"Capturing CUDA graphs"), "capturing CUDA graphs"),
    ("cuda-graphs", re.compile(r"Graph capturing finished in (?P<s>\d+) secs"),
     lambda m: f"CUDA graphs captured in {m['s']} s"),
    ("engine-ready", re.compile(r"init engine \(profile, create kv cache, warmup model\) took (?P<s>[\d.]+) s"),
     lambda m: f"engine ready (profile, KV cache, warm-up took {float(m['s']):.1f} s)"),
    ("api-server", re.compile(r"Starting vLLM (?:API )?server on (?P<url>\S+)"),
     lambda m: f"API server starting on {m['url']}"),
)
ORDER = ("starting", "config", "workers", "loading", "shards", "loaded", "compiling", "kv-cache", "cuda-graphs",
         "engine-ready", "api-server")
STARTING = Step("starting", 0, "vLLM starting (no output yet: importing vLLM and torch)")


def step_of(line: str) -> Step | None:
    """The step a line of vLLM's log marks, or None."""
    for name, pattern, say in _STEPS:
        m = pattern.search(line)
        if m:
            return Step(name, ORDER.index(name), say if isinstance(say, str) else say(m))
    return None


def lines_of(text: str) -> list[str]:
    """The log's lines, a progress bar's redraws (carriage returns) each a line of its own."""
    return [seg for ln in text.splitlines() for seg in ln.split("\r") if seg.strip()]


def latest_step(text: str) -> Step | None:
    """The furthest step the log shows (the last one in vLLM's order, the newest line of it)."""
    best: Step | None = None
    for ln in lines_of(text):
        s = step_of(ln)
        if s is not None and (best is None or s.order >= best.order):
            best = s
    return best


@dataclass
class Progress:
    """What to report as the log grows: a new step at once, a moving detail every MOVING_S seconds,
    the same step again every HEARTBEAT_S seconds with how long it has lasted. Never a step earlier
    than one reported (the tail read may lose the newest lines of a rotating bar)."""

    shown: Step | None = None
    since: float = 0.0  # when the shown step was first seen
    said_at: float = float("-inf")
    said: str = ""

    def update(self, step: Step | None, now: float) -> str | None:
        """The line to report at NOW for the log's latest step (None: no output yet), or None."""
        step = step or STARTING
        if self.shown is not None and step.order < self.shown.order:
            step = self.shown
        if self.shown is None or step.name != self.shown.name:
            self.shown, self.since = step, now
            return self._say(step.text, step.text, now)
        self.shown = step
        if step.text != self.said and now - self.said_at >= MOVING_S:
            return self._say(step.text, step.text, now)
        if now - self.said_at >= HEARTBEAT_S:
            return self._say(step.text, f"{step.text} (this step {now - self.since:.0f} s so far)", now)
        return None

    def _say(self, text: str, line: str, now: float) -> str:
        self.said, self.said_at = text, now
        return line
