"""What `bootstrap logs` and `doctor` read on each host (pure: names and filters, no host touched).

A cluster's logs live in five places, each a *source*:

* ``node``: the cluster container of every host (`docker logs <container_name>`): `ray start --block`
  (or the holding process of the native mode), the NCCL check's output.
* ``vllm``: vLLM's own output. One serving group: `vllm serve` runs inside the cluster container and
  writes ``/tmp/bootstrap-vllm-serve.log`` there (the head; in the native mode every node). Replicas:
  the ``<container_name>-serve`` container of every member (`docker logs`).
* ``keeper``: replicas only: each host's ``<container_name>-keeper``, which restarts a serve container
  that exited, saying how it exited.
* ``router``: replicas only: ``<container_name>-router`` (vllm-router) on the first replica's head.
* ``prometheus``: ``<container_name>-prometheus`` on the monitor host, after `bootstrap monitor up`.

`candidates` lists where each source could be; what a host actually holds (its containers, the serve
log file) is looked up over SSH by doctor/run.py, and `present` keeps what is there.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Collection, Mapping, Sequence

from bootstrap.errors import UsageError
from bootstrap.fleet import names as FN
from bootstrap.model import Inventory
from bootstrap.monitor import plan as MP

#: vLLM's output inside the cluster container when one group serves (serve/run.py writes it).
SERVE_LOG = "/tmp/bootstrap-vllm-serve.log"
SOURCES = ("node", "vllm", "keeper", "router", "prometheus")
#: The CLI's selectors (`logs --node/--serve/--router/--monitor`) -> the sources each one shows.
GROUPS: dict[str, tuple[str, ...]] = {"node": ("node",), "serve": ("vllm", "keeper"), "router": ("router",),
                                      "monitor": ("prometheus",)}


@dataclass(frozen=True)
class LogSource:
    host: str
    #: one of SOURCES
    source: str
    #: the container holding the log
    container: str
    #: a file inside the container; None: the container's own log (`docker logs`)
    path: str | None = None
    #: a pool's model whose replica this host's vLLM serves (models:), else None
    model: str | None = None

    def describe(self) -> str:
        where = f"{self.path} in {self.container}" if self.path else f"container {self.container}"
        return f"{self.source}{f'[{self.model}]' if self.model else ''} on {self.host} ({where})"

    @property
    def label(self) -> str:
        """How a line names its source: `vllm`, or in a pool `vllm[chat]`."""
        return f"{self.source}[{self.model}]" if self.model else self.source


def sources_for(groups: Collection[str]) -> tuple[str, ...]:
    """The sources the selected groups show (none selected: every source)."""
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        raise UsageError(f"unknown log group {unknown[0]!r}: choose from {', '.join(GROUPS)}")
    if not groups:
        return SOURCES
    return tuple(s for s in SOURCES if any(s in GROUPS[g] for g in groups))


def candidates(inv: Inventory, hosts: Sequence[str] = (), sources: Collection[str] = SOURCES) -> list[LogSource]:
    """Every place a selected source could be on the selected hosts (default: every host), in
    inventory order, a host's sources in SOURCES order."""
    chosen = [inv.host(n).name for n in hosts] if hosts else [h.name for h in inv.hosts]
    name = inv.cluster.container_name
    fleet = inv.cluster.replicas > 1
    out: list[LogSource] = []
    for host in chosen:
        here: list[LogSource] = [LogSource(host, "node", name)]
        if fleet:
            m = inv.model_of(inv.host(host).replica) if inv.models and inv.host(host).replica >= 0 else None
            here.append(LogSource(host, "vllm", FN.serve_name(inv), model=m.name if m else None))
            here.append(LogSource(host, "keeper", FN.keeper_name(inv)))
            if host in {h.name for h in FN.router_hosts(inv)}:
                here.append(LogSource(host, "router", FN.router_name(inv)))
                if inv.cluster.router.vip is not None:
                    here.append(LogSource(host, "keepalived", FN.vip_name(inv)))
        else:
            here.append(LogSource(host, "vllm", name, SERVE_LOG))
        if MP.monitor_host(inv).name == host:
            here.append(LogSource(host, "prometheus", MP.prometheus_name(inv)))
        out.extend(s for s in here if s.source in sources)
    return out


def present(cands: Sequence[LogSource], containers: Mapping[str, Collection[str]],
            files: Mapping[str, Collection[str]]) -> tuple[list[LogSource], list[LogSource]]:
    """(the candidates a host holds, the ones it does not). containers: host -> the names of its
    containers (running or not); files: host -> the candidates' files that exist (paths)."""
    found, missing = [], []
    for s in cands:
        ok = s.container in containers.get(s.host, ()) and (s.path is None or s.path in files.get(s.host, ()))
        (found if ok else missing).append(s)
    return found, missing


# -- --since ---------------------------------------------------------------------------------------
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


#: The latest start a host's tools take: `docker logs --since` and the vLLM log's filter read
#: years of four digits (and the year after a start's is looked at).
_LAST_SINCE = datetime(9999, 1, 1, tzinfo=timezone.utc).timestamp()


def parse_since(text: str, now: float) -> float:
    """`--since` as a UTC epoch: a duration back from now (30s, 10m, 2h, 1d) or a time
    (2026-11-25T22:10:00, with Z or an offset; without one it is UTC), from 1970 to 9998 (the
    hosts' `docker logs --since` takes no earlier time, and none past what their clocks hold).
    UsageError otherwise."""
    t = text.strip()
    shown = repr(t if len(t) <= 40 else t[:37] + "...")
    m = _RELATIVE.match(t)
    if m:
        start = now - float(m.group(1)) * _UNITS[m.group(2)]
        if not start >= 0:  # -inf and nan too
            raise UsageError(f"{shown} goes back before 1970 (Unix time 0), where no log starts: give a shorter "
                             "duration")
        return start
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"{shown} is neither a duration (30s, 10m, 2h, 1d) nor a time "
                         "(2026-11-25T22:10:00Z)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    try:
        start = dt.timestamp()
    except (OverflowError, ValueError):
        start = -1.0 if dt.year < 1970 else _LAST_SINCE
    if start < 0:
        raise UsageError(f"{shown} is before 1970 (Unix time 0), where no log starts: give a later time")
    if start >= _LAST_SINCE:
        raise UsageError(f"{shown} is after 9998: give a time the hosts' clocks can hold")
    return start


#: vLLM's logger prefix: `INFO 11-25 22:10:01 [file.py:12] ...`, maybe after `(APIServer pid=7) `.
_VLLM_TIME = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\b")


def vllm_line_time(line: str, year: int) -> float | None:
    """The UTC epoch of a vLLM log line (its logger prints month-day and time, in the container's
    time zone, UTC in vLLM's images), or None for a line without one (a traceback, print output)."""
    m = _VLLM_TIME.search(line)
    if not m:
        return None
    mo, d, hh, mi, ss = map(int, m.groups())
    try:
        return datetime(year, mo, d, hh, mi, ss, tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


class SinceFilter:
    """Keeps the lines of a vLLM log file written at or after `since` (a UTC epoch; `docker logs
    --since` does this for container logs). A line without a time stamp goes with the line before
    it (a traceback belongs to the error above it); lines before the first stamped one are dropped.
    The year is since's, or the one before when the stamp would lie over half a year after since."""

    def __init__(self, since: float):
        self.since = since
        self.keep = False
        self._year = datetime.fromtimestamp(since, timezone.utc).year

    def __call__(self, line: str) -> bool:
        t = vllm_line_time(line, self._year)
        if t is not None:
            if t - self.since > timedelta(days=183).total_seconds():
                t = vllm_line_time(line, self._year - 1)
            self.keep = t is not None and t >= self.since
        return self.keep
