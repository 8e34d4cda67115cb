"""Pure parsers for the distributed sanity check (`checks/nccl_check.py`) and NCCL's own log.

No I/O here: the controller collects the text (every node's torchrun output, interleaved with NCCL
log lines and torchrun warnings) and hands it to

- `parse_events(text)`: the check's JSON lines -> `CheckReport` (which rank reached which phase,
  on which host / node / VLLM_HOST_IP; the bandwidth rows; the final result);
- `bandwidth_note(...)` / `format_bandwidth(...)`: what to show for bandwidth: the rows, or a note
  instead of them ("one rank: nothing to measure": a single rank communicates with nobody);
- `nodes_missing_phase(report, phase, expected_node_ranks)`: which nodes never got to a phase;
- `parse_nccl_transport(log_text)`: `NCCL_DEBUG=INFO` output -> `NcclTransport` (NCCL version,
  network IB or Socket, GPU Direct RDMA, interfaces, per-channel transports);
- `fallback_to_socket(transport, infiniband_configured)`: a loud warning when InfiniBand was
  configured but NCCL went over TCP sockets.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

#: The check's phases, in the order it runs them.
PHASES = ("start", "init", "allreduce", "gloo", "vllm", "bandwidth", "done")

#: The bandwidth phase's skip reason on a single-rank run (as checks/nccl_check.py says it), and
#: what is shown instead of bandwidth rows for one rank, whichever version of the check ran.
ONE_RANK = "one rank: nothing to measure"

_PHASE_KEYS = {"event", "phase", "ok", "rank", "local_rank", "node_rank", "host", "vllm_host_ip",
               "t", "error", "skipped"}


# ================================================================================================
# The check's JSON lines
# ================================================================================================
@dataclass(frozen=True)
class PhaseEvent:
    phase: str
    ok: bool
    rank: int | None
    local_rank: int | None = None
    node_rank: int | None = None
    host: str | None = None
    vllm_host_ip: str | None = None
    t: float | None = None
    error: str | None = None
    #: the reason a phase was skipped (it then has ok true), e.g. "vllm not importable"
    skipped: str | None = None
    #: any other keys of the line (backend, world_size, pid, detail, ...)
    extra: dict = field(default_factory=dict)


@dataclass
class RankStatus:
    rank: int
    local_rank: int | None = None
    node_rank: int | None = None
    host: str | None = None
    vllm_host_ip: str | None = None
    #: phase name -> its event (a failure is never replaced by a later success line)
    phases: dict[str, PhaseEvent] = field(default_factory=dict)

    @property
    def reached(self) -> list[str]:
        """Phases this rank passed (ok true), in run order."""
        return [p for p in PHASES if p in self.phases and self.phases[p].ok] + sorted(
            p for p, e in self.phases.items() if p not in PHASES and e.ok)

    @property
    def last_phase(self) -> str | None:
        """The last phase this rank passed."""
        done = [p for p in PHASES if p in self.phases and self.phases[p].ok]
        return done[-1] if done else None

    @property
    def failed(self) -> list[PhaseEvent]:
        return [e for e in self.phases.values() if not e.ok]


@dataclass(frozen=True)
class BandwidthRow:
    bytes: int
    count: int
    dtype: str
    time_us: float
    algbw_GBps: float
    busbw_GBps: float


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    world_size: int | None
    backend: str | None
    nnodes: int | None
    torch: str | None
    nccl_version: str | None


@dataclass
class CheckReport:
    #: rank -> what that rank reported
    ranks: dict[int, RankStatus] = field(default_factory=dict)
    #: every phase line, in the order read
    events: list[PhaseEvent] = field(default_factory=list)
    #: the all-reduce sweep, one row per size; never rows timed on a single rank (see below)
    bandwidth: list[BandwidthRow] = field(default_factory=list)
    #: why there are no bandwidth rows, when the check says or the world size implies it:
    #: `ONE_RANK` for a single-rank run, "--no-bandwidth"; None otherwise
    bandwidth_skipped: str | None = None
    #: rows a check from before the one-rank skip timed on a single rank (an all-reduce that
    #: moves nothing: up to 16952 GB/s "algbw" on one H100); kept for the record, not bandwidth
    discarded_bandwidth: list[BandwidthRow] = field(default_factory=list)
    #: rank 0's final line; None when rank 0 never got there (killed, never started)
    result: CheckResult | None = None
    #: non-JSON lines that state an error: Python exceptions' last lines (torchrun's rendezvous
    #: "DistStoreError: Timed out ... 1/2 clients joined", ChildFailedError, ...), "NCCL WARN"
    errors: list[str] = field(default_factory=list)
    #: how many lines were not the check's JSON (NCCL INFO, torchrun banners, tracebacks)
    other_lines: int = 0

    @property
    def ok(self) -> bool:
        """True only with rank 0's result ok and no rank reporting a failed phase."""
        return bool(self.result and self.result.ok and not self.failures)

    @property
    def failures(self) -> list[PhaseEvent]:
        return [e for e in self.events if not e.ok]

    @property
    def world_size(self) -> int | None:
        if self.result and self.result.world_size is not None:
            return self.result.world_size
        sizes = [e.extra.get("world_size") for e in self.events
                 if isinstance(e.extra.get("world_size"), int)]
        return max(sizes) if sizes else None

    def hosts(self) -> dict[int, str | None]:
        """node_rank -> host name, as the ranks reported it."""
        out: dict[int, str | None] = {}
        for st in self.ranks.values():
            if st.node_rank is not None and out.get(st.node_rank) is None:
                out[st.node_rank] = st.host
        return dict(sorted(out.items()))

    def ranks_on_node(self, node_rank: int) -> list[int]:
        return sorted(r for r, st in self.ranks.items() if st.node_rank == node_rank)


_EXC_LINE = re.compile(r"^(?:\[[^\]]*\]:?\s*)?(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Timeout)"
                       r"(?::\s.*|:)?$")
_NCCL_WARN = re.compile(r"\bNCCL WARN\b")


def _as_int(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _json_objects(line: str):
    """Every {"event": ...} object on a line, wherever it starts (prefixes such as "[default0]:",
    "gpu-a | " or two half-interleaved writes are tolerated)."""
    dec = json.JSONDecoder()
    i = line.find('{"event"')
    while i != -1:
        try:
            obj, end = dec.raw_decode(line, i)
        except ValueError:
            i = line.find('{"event"', i + 1)
            continue
        if isinstance(obj, dict):
            yield obj
        i = line.find('{"event"', end)


def parse_events(text: str) -> CheckReport:
    """Parse the check's output, as collected from every node (any order, any interleaving)."""
    rep = CheckReport()
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        found = False
        for obj in _json_objects(line):
            found = True
            kind = obj.get("event")
            if kind == "phase" and isinstance(obj.get("phase"), str):
                _add_phase(rep, obj)
            elif kind == "bandwidth":
                try:
                    rep.bandwidth.append(BandwidthRow(
                        bytes=int(obj["bytes"]), count=int(obj["count"]),
                        dtype=str(obj.get("dtype", "float32")), time_us=float(obj["time_us"]),
                        algbw_GBps=float(obj["algbw_GBps"]), busbw_GBps=float(obj["busbw_GBps"])))
                except (KeyError, TypeError, ValueError):
                    rep.other_lines += 1
            elif kind == "result":
                rep.result = CheckResult(
                    ok=obj.get("ok") is True, world_size=_as_int(obj.get("world_size")),
                    backend=obj.get("backend"), nnodes=_as_int(obj.get("nnodes")),
                    torch=obj.get("torch"), nccl_version=obj.get("nccl_version"))
        if not found:
            rep.other_lines += 1
            if _EXC_LINE.match(line) or _NCCL_WARN.search(line):
                rep.errors.append(line[:500])
    skips = [e.skipped for e in rep.events if e.phase == "bandwidth" and e.ok and e.skipped]
    if skips:
        rep.bandwidth_skipped = str(skips[0])
    if rep.world_size == 1:
        # An older check timed all-reduces on one rank too: those rows are not bandwidth.
        rep.discarded_bandwidth, rep.bandwidth = rep.bandwidth, []
        if rep.bandwidth_skipped is None:
            rep.bandwidth_skipped = ONE_RANK
    return rep


def _add_phase(rep: CheckReport, obj: dict) -> None:
    ev = PhaseEvent(
        phase=obj["phase"], ok=obj.get("ok") is True, rank=_as_int(obj.get("rank")),
        local_rank=_as_int(obj.get("local_rank")), node_rank=_as_int(obj.get("node_rank")),
        host=obj.get("host"), vllm_host_ip=obj.get("vllm_host_ip"),
        t=obj.get("t") if isinstance(obj.get("t"), (int, float)) else None,
        error=obj.get("error"), skipped=obj.get("skipped"),
        extra={k: v for k, v in obj.items() if k not in _PHASE_KEYS})
    rep.events.append(ev)
    if ev.rank is None:
        return
    st = rep.ranks.get(ev.rank)
    if st is None:
        st = rep.ranks[ev.rank] = RankStatus(rank=ev.rank)
    for attr in ("local_rank", "node_rank", "host", "vllm_host_ip"):
        if getattr(ev, attr) is not None:
            setattr(st, attr, getattr(ev, attr))
    prev = st.phases.get(ev.phase)
    if prev is None or prev.ok:  # a failure stays recorded
        st.phases[ev.phase] = ev


def bandwidth_note(world_size: int | None, rows=(), skipped: str | None = None) -> str | None:
    """What to show instead of bandwidth rows, or None when `rows` are measurements to show.

    A single rank (`world_size` 1) gives `ONE_RANK` whatever rows came with it; otherwise the
    check's skip reason (`CheckReport.bandwidth_skipped`) when there are no rows.
    """
    if world_size == 1:
        return ONE_RANK
    if skipped and not rows:
        return skipped
    return None


def format_bandwidth(world_size: int | None, backend: str | None, rows,
                     skipped: str | None = None) -> list[str]:
    """The bandwidth section as plain text lines: the note of `bandwidth_note` in place of the
    rows, or a heading and one row per size (nccl-tests' columns); [] when there is nothing."""
    note = bandwidth_note(world_size, rows, skipped)
    if note:
        return [f"all-reduce bandwidth ({backend or 'unknown backend'}): {note}"]
    if not rows:
        return []
    out = [f"all-reduce bandwidth ({backend or 'unknown backend'}, {world_size} ranks)",
           f"{'size (B)':>12} {'count':>11} {'time (us)':>12} {'algbw (GB/s)':>14} {'busbw (GB/s)':>14}"]
    out += [f"{r.bytes:>12} {r.count:>11} {r.time_us:>12.1f} {r.algbw_GBps:>14.4f} {r.busbw_GBps:>14.4f}"
            for r in rows]
    return out


def nodes_missing_phase(report: CheckReport, phase: str, expected_node_ranks,
                        ranks_per_node: int | None = None) -> list[int]:
    """The node ranks, of `expected_node_ranks`, that did not get to `phase`.

    A node got to a phase when one of its ranks printed a line for it, ok or not: a node whose
    init failed *waiting for a peer* did get there, the peer that never showed up did not (a
    failed phase is in `report.failures`). With `ranks_per_node`, a node counts as missing when
    fewer of its ranks than that got there (one GPU's process died).
    """
    got: dict[int, set[int]] = {}
    for ev in report.events:
        if ev.phase == phase and ev.node_rank is not None:
            got.setdefault(ev.node_rank, set()).add(ev.rank if ev.rank is not None else -1)
    need = ranks_per_node if ranks_per_node else 1
    return sorted(n for n in set(expected_node_ranks) if len(got.get(n, ())) < need)


def nodes_failed_phase(report: CheckReport, phase: str | None = None) -> list[int]:
    """The node ranks on which some rank reported a failed phase (`phase`, or any)."""
    return sorted({e.node_rank for e in report.failures
                   if e.node_rank is not None and (phase is None or e.phase == phase)})


# ================================================================================================
# NCCL_DEBUG=INFO output
# ================================================================================================
@dataclass(frozen=True)
class NetInterface:
    name: str
    address: str  # may be "" (old NCCL printed "[0]enp41s0f1:<0>")

    def __str__(self) -> str:
        return f"{self.name}:{self.address}" if self.address else self.name


@dataclass(frozen=True)
class NcclChannel:
    channel: int | None  # None for the oldest "3 -> 12 via NET/IB/0" form
    src: int
    dst: int
    direction: str | None  # "send" / "receive" for network connections, else None
    via: str  # as printed: "NET/IB/0/GDRDMA", "NET/Socket/3", "P2P/IPC/read", "SHM/direct/direct"
    transport: str  # "IB", "Socket", other NET plugin name, "P2P", "SHM", "CollNet", "NVLS", ...
    gdrdma: bool
    host: str | None = None

    @property
    def network(self) -> bool:
        return self.via.startswith("NET/")


@dataclass
class NcclTransport:
    #: "2.21.5" (without the "+cuda12.4" suffix); None when not in the text
    nccl_version: str | None = None
    cuda_version: str | None = None
    #: the network between nodes: "IB" or "Socket" (or a plugin's name, e.g. "AWS Libfabric");
    #: from the channel lines when there are any, else from "Using network X", else from which
    #: of "NET/IB : Using" / "NET/Socket : Using" was printed; None when nothing says
    network: str | None = None
    #: what "Using network X" lines said, de-duplicated in order ("IB", "IBext", "Socket")
    networks_announced: list[str] = field(default_factory=list)
    #: the NET transports that channels actually went over ("IB", "Socket", ...)
    net_transports: list[str] = field(default_factory=list)
    #: the intra-node transports channels used ("P2P", "SHM", ...)
    intra_transports: list[str] = field(default_factory=list)
    #: some network channel used GPU Direct RDMA (".../GDRDMA")
    gdrdma: bool = False
    #: "GPU Direct RDMA Disabled for ..." was printed
    gdrdma_disabled: bool = False
    #: HCAs from "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ...", e.g. "mlx5_0:1/IB"
    ib_devices: list[str] = field(default_factory=list)
    #: the IB transport's out-of-band interface ("; OOB eth0:10.0.0.1<0>")
    ib_oob: list[NetInterface] = field(default_factory=list)
    #: "NET/IB : No device found"
    ib_no_device: bool = False
    #: NCCL_IB_DISABLE set to 1 by the environment
    ib_disabled: bool = False
    #: "Failed to open libibverbs.so"
    ibverbs_missing: bool = False
    #: interfaces from "NET/Socket : Using [0]eth0:10.0.0.1<0> ..."
    socket_interfaces: list[NetInterface] = field(default_factory=list)
    #: interfaces from "Bootstrap : Using eth0:10.0.0.1<0>"
    bootstrap_interfaces: list[NetInterface] = field(default_factory=list)
    #: a network plugin in use ("IBext" from "P2P plugin IBext", a loaded plugin's name)
    plugin: str | None = None
    channels: list[NcclChannel] = field(default_factory=list)
    #: host names seen in the "host:pid:tid [dev] NCCL" prefixes
    hosts: list[str] = field(default_factory=list)
    #: "NCCL WARN ..." lines
    warnings: list[str] = field(default_factory=list)

    @property
    def uses_ib(self) -> bool:
        return self.network == "IB" or "IB" in self.net_transports

    @property
    def uses_socket(self) -> bool:
        return self.network == "Socket" or "Socket" in self.net_transports

    @property
    def inter_node(self) -> bool:
        """Some channel crossed nodes (went over a NET transport)."""
        return bool(self.net_transports)


_PREFIX = re.compile(r"(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL (?:INFO|WARN)")
_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)(?:[.-]\d+)?(?:\+cuda(\d+(?:\.\d+)*))?")
_VLLM_NCCL = re.compile(r"vLLM is using nccl==(\d+\.\d+\.\d+)")
_USING_NETWORK = re.compile(r"NCCL INFO Using (?:internal )?[Nn]etwork (\S+(?: \S+)*?)\s*$")
_IB_USING = re.compile(r"NET/IB ?: Using (?P<devs>.*?)(?:;\s*OOB (?P<oob>.*))?$")
_IB_DEV = re.compile(r"([A-Za-z][\w.-]*:\d+/(?:IB|RoCE)(?:/SHARP)?)")
_IB_DEV_OLD = re.compile(r"NET/IB: \[\d+\] ([A-Za-z][\w.-]*:\d+/(?:IB|RoCE))")
_SOCKET_USING = re.compile(r"NET/Socket ?: Using (?P<ifs>.*)$")
_IFACE = re.compile(r"(?:\[\d+\])?([A-Za-z][\w.@-]*):([0-9A-Fa-f.:%]*)<\d+>")
_BOOTSTRAP = re.compile(r"Bootstrap ?: Using (?P<ifs>.*)$")
_CHANNEL = re.compile(
    r"NCCL INFO (?:(?:Channel|Ring) (?P<ch>\d+)(?:/\d+)? ?: )?"
    r"(?P<src>\d+)(?:\[[0-9a-fA-Fx]+\])? -> (?P<dst>\d+)(?:\[[0-9a-fA-Fx]+\])?"
    r"(?: \[(?P<dir>send|receive)\])? via (?P<via>.+?)(?:\s+comm 0x[0-9a-fA-F]+.*)?\s*$")
_OLDEST_CHANNEL = re.compile(
    r"\] INFO (?P<src>\d+) -> (?P<dst>\d+) via (?P<via>\S+)\s*$")  # NCCL 2.3: "[4] INFO 3 -> 12 via"
_PLUGIN = re.compile(r"(?:P2P plugin (?P<p2p>\S+)"
                     r"|NET/Plugin ?: Loaded net plugin (?P<name>.+?)(?: \(v\d+\))?\s*$)")


def _transport_of(via: str) -> str:
    parts = via.split("/")
    if parts[0] == "NET" and len(parts) > 1:
        name = parts[1]
        if name.startswith("IB"):  # IB, IBext, IBext_v8 (the SHARP/RDMA plugin)
            return "IB"
        return name
    if via.startswith("direct shared memory"):
        return "SHM"
    return parts[0].split()[0]


def _add_unique(seq: list, item) -> None:
    if item not in seq:
        seq.append(item)


def parse_nccl_transport(log_text: str) -> NcclTransport:
    """What NCCL chose, from `NCCL_DEBUG=INFO` output (several hosts' lines may be mixed in, with
    any prefix such as "(RayWorkerWrapper pid=..)" or "[1,0]<stdout>:")."""
    tr = NcclTransport()
    saw: set[str] = set()  # "ib", "socket": NCCL said which devices or interfaces it uses
    for raw in log_text.splitlines():
        line = raw.rstrip()
        if "NCCL" not in line and "nccl" not in line and "INFO" not in line:
            continue
        m = _PREFIX.search(line)
        host = m.group("host") if m else None
        if host and host not in tr.hosts:
            tr.hosts.append(host)
        _version_and_warning(tr, line)
        if not _channel_line(tr, line, host):
            _network_line(tr, line, saw)
    tr.network = _decide_network(tr, "ib" in saw, "socket" in saw)
    return tr


def _version_and_warning(tr: NcclTransport, line: str) -> None:
    if tr.nccl_version is None:
        mv = _VERSION.search(line) or _VLLM_NCCL.search(line)
        if mv:
            tr.nccl_version = mv.group(1)
            if mv.re is _VERSION and mv.group(2):
                tr.cuda_version = mv.group(2)
    if "NCCL WARN" in line:
        tr.warnings.append(line[line.find("NCCL WARN"):][:300])


def _channel_line(tr: NcclTransport, line: str, host: str | None) -> bool:
    """A channel's line ("0 -> 1 via NET/IB/0") recorded; False when the line is none."""
    mc = _CHANNEL.search(line) or _OLDEST_CHANNEL.search(line)
    if not mc:
        return False
    via = mc.group("via").strip()
    d = mc.groupdict()
    ch = NcclChannel(channel=int(d["ch"]) if d.get("ch") else None, src=int(d["src"]),
                     dst=int(d["dst"]), direction=d.get("dir"), via=via,
                     transport=_transport_of(via), gdrdma="GDRDMA" in via, host=host)
    tr.channels.append(ch)
    if ch.network:
        _add_unique(tr.net_transports, ch.transport)
        tr.gdrdma = tr.gdrdma or ch.gdrdma
    else:
        _add_unique(tr.intra_transports, ch.transport)
    return True


def _network_line(tr: NcclTransport, line: str, saw: set[str]) -> None:
    """What a line that is no channel's says of the network: announced, missing or disabled devices,
    the devices and interfaces in use, the plugin."""
    mn = _USING_NETWORK.search(line)
    if mn:
        _add_unique(tr.networks_announced, mn.group(1))
        return
    if "NET/IB : No device found" in line or "NET/IB: No device found" in line:
        tr.ib_no_device = True
        return
    if re.search(r"NCCL_IB_DISABLE set by environment to 1\b", line):
        tr.ib_disabled = True
    if "Failed to open libibverbs" in line:
        tr.ibverbs_missing = True
    if "GPU Direct RDMA Disabled" in line:
        tr.gdrdma_disabled = True
    if _interfaces_line(tr, line, saw):
        return
    mp = _PLUGIN.search(line)
    if mp and tr.plugin is None:
        tr.plugin = (mp.group("p2p") or mp.group("name")).strip()


def _interfaces_line(tr: NcclTransport, line: str, saw: set[str]) -> bool:
    """The IB devices, socket and bootstrap interfaces a line names, recorded; False when it names none."""
    mi = _IB_USING.search(line)
    if mi and "interface" not in mi.group("devs"):
        saw.add("ib")
        for dev in _IB_DEV.findall(mi.group("devs")):
            _add_unique(tr.ib_devices, dev)
        for name, addr in _IFACE.findall(mi.group("oob") or ""):
            _add_unique(tr.ib_oob, NetInterface(name, addr))
        return True
    mo = _IB_DEV_OLD.search(line)
    if mo:  # NCCL 2.3: "NET/IB: [0] mlx5_1:1/IB"
        saw.add("ib")
        _add_unique(tr.ib_devices, mo.group(1))
        return True
    ms = _SOCKET_USING.search(line)
    if ms:
        saw.add("socket")
        for name, addr in _IFACE.findall(ms.group("ifs")):
            _add_unique(tr.socket_interfaces, NetInterface(name, addr))
        return True
    mb = _BOOTSTRAP.search(line)
    if mb:
        for name, addr in _IFACE.findall(mb.group("ifs")):
            _add_unique(tr.bootstrap_interfaces, NetInterface(name, addr))
        return True
    return False


def _normalize_network(name: str) -> str:
    return "IB" if name.startswith("IB") else name


def _decide_network(tr: NcclTransport, saw_ib_using: bool, saw_socket_using: bool) -> str | None:
    if tr.net_transports:  # what channels actually used wins
        if "Socket" in tr.net_transports:
            return "Socket"  # one TCP channel is enough to make it the bottleneck
        return tr.net_transports[0]
    if tr.networks_announced:
        names = [_normalize_network(n) for n in tr.networks_announced]
        return "Socket" if "Socket" in names else names[0]
    # NCCL < 2.6 printed no "Using network" line. It prefers IB whenever it found a device; the
    # NET/Socket line it printed anyway is its bootstrap interface.
    if saw_ib_using and not tr.ib_no_device and not tr.ib_disabled:
        return "IB"
    if saw_socket_using:
        return "Socket"
    return None


def fallback_to_socket(transport: NcclTransport, infiniband_configured: bool) -> str | None:
    """A warning when the inventory says InfiniBand but NCCL used TCP sockets; else None."""
    if not infiniband_configured or not transport.uses_socket:
        return None
    if transport.socket_interfaces:
        ifs = ", ".join(str(i) for i in transport.socket_interfaces)
    elif transport.bootstrap_interfaces:
        ifs = ("interfaces not named in the log (NCCL bootstrapped over "
               + ", ".join(str(i) for i in transport.bootstrap_interfaces) + ")")
    else:
        ifs = "interfaces not named in the log"
    where = ("inter-node channels went over NET/Socket" if "Socket" in transport.net_transports
             else "NCCL selected the Socket network")
    reasons = []
    if transport.ib_disabled:
        reasons.append("NCCL_IB_DISABLE=1 is set in the environment")
    if transport.ib_no_device:
        reasons.append("NCCL found no InfiniBand device ('NET/IB : No device found'): is "
                       "/dev/infiniband passed into the container, with IPC_LOCK and an "
                       "unlimited memlock?")
    if transport.ibverbs_missing:
        reasons.append("libibverbs could not be loaded in the container (install rdma-core / "
                       "libibverbs1 in the image)")
    if transport.plugin and transport.plugin.startswith("IB"):
        reasons.append(f"the {transport.plugin} network plugin was loaded but found no usable "
                       "HCA (NCCL_IB_HCA, HCA state, /dev/infiniband in the container)")
    if not reasons:
        reasons.append("check NCCL_IB_HCA, that the HCAs are up (ibstat) and visible in the "
                       "container, and NCCL_NET / NCCL_IB_DISABLE")
    mixed = (" (some channels did use IB: " + ", ".join(transport.net_transports) + ")"
             if len(transport.net_transports) > 1 else "")
    return ("WARNING: InfiniBand is configured for this cluster, but NCCL fell back to TCP "
            f"sockets: {where}{mixed}, over {ifs}. Expect a fraction of the IB bandwidth. "
            "Likely cause: " + "; ".join(reasons) + ".")
