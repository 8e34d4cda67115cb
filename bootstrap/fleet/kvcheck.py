"""The KV transfer check of a disaggregated fleet (checks/kv_check.py): what each side runs, and
what its output means. Pure; no I/O (fleet/run.py runs it over SSH before any member starts).

Each decode replica's head reads a buffer the size of a few KV blocks from each prefill
replica's head over NIXL (UCX), as vLLM's NixlConnector will: in the memory the plan gives the KV
cache (host memory on CPU nodes, GPU memory on GPU nodes), with the UCX variables the members
get (UCX_NET_DEVICES from the node's InfiniBand facts), over the fleet's KV side-channel port.
A decode node that cannot reach a prefill node, a UCX that cannot register or move that memory,
or a NIXL that does not match the node's CUDA fails here in one line, not as a request that
hangs after `serve` said ready.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from bootstrap.fleet import names as FN
from bootstrap.model import Host, Inventory

#: The buffer each pair moves: 16 MiB in 64 blocks (a few KV blocks' worth), read 3 times after the
#: first read (which includes UCX's connection set-up).
MIB = 16
BLOCKS = 64
ROUNDS = 3
#: Seconds each side may take, imports (torch, NIXL) included.
TIMEOUT_S = 90.0
#: UCX prints, per protocol it selects, a table of ranges and transports (UCX_PROTO_INFO=y): the
#: reader's tells which transport its reads of the KV buffer use.
PROTO_INFO = {"UCX_PROTO_INFO": "y", "UCX_LOG_FILE": "stderr"}  # stdout keeps the script's JSON lines
_READ_TITLE = re.compile(r"\|\s*remote memory read by ucp_get\S* into (?P<into>.+?) from (?P<frm>.+?)\s*\|\s*$")
_ROW = re.compile(r"\|\s*(?P<range>\d+\.\.\S+)\s*\|\s*(?P<desc>[^|]*?)\s*\|\s*(?P<config>[^|]*?)\s*\|\s*$")
#: UCX transports that are RDMA (InfiniBand or RoCE verbs; the mlx5 accelerated ones first).
RDMA_TRANSPORTS = ("rc_mlx5", "dc_mlx5", "ud_mlx5", "rc_verbs", "ud_verbs", "rc", "dc", "ud")


@dataclass(frozen=True)
class Pair:
    """One check: `reader` (a decode replica's head) reads from `source` (a prefill replica's head)."""
    source: Host
    reader: Host
    source_replica: int
    reader_replica: int


@dataclass(frozen=True)
class PairResult:
    source: str
    reader: str
    ok: bool
    #: the phase that failed and why ("" when ok)
    error: str = ""
    device: str | None = None
    bytes: int | None = None
    first_s: float | None = None
    best_s: float | None = None
    gbps: float | None = None
    #: the transports UCX chose for the reads, "config (how)" each (read_protocols)
    via: tuple[str, ...] = ()

    @property
    def rdma(self) -> bool | None:
        """Whether the reads went over RDMA (None: UCX did not say)."""
        if not self.via:
            return None
        return any(v.split("/", 1)[0] in RDMA_TRANSPORTS for v in self.via)

    def describe(self) -> str:
        if not self.ok:
            return f"{self.reader} could not read KV from {self.source}: {self.error}"
        size = f"{(self.bytes or 0) / (1 << 20):.0f} MiB" if self.bytes else "the buffer"
        via = f" via {', '.join(self.via)}" if self.via else ""
        best = f"{self.best_s * 1000:.1f} ms" if self.best_s is not None else "?"
        first = f"{self.first_s * 1000:.0f} ms" if self.first_s is not None else "?"
        return (f"{self.reader} (decode) read {size} of {self.device} memory from {self.source} (prefill) "
                f"over NIXL{via}: {self.gbps} GB/s (best of {ROUNDS} reads, {best}; first read {first} "
                "with connection set-up)")

    def warning(self, infiniband: bool) -> str | None:
        """With cluster.infiniband, reads that UCX did over TCP: the KV cache will move that way too."""
        if not (infiniband and self.ok and self.rdma is False):
            return None
        return (f"the KV transfer check from {self.source} to {self.reader} read over {', '.join(self.via)}, not "
                "InfiniBand: UCX found no usable RDMA device in the cluster containers (is /dev/infiniband passed "
                "in, with IPC_LOCK and an unlimited memlock? are the node's RDMA ports ACTIVE? `bootstrap doctor` "
                "reads both)")

    def to_dict(self) -> dict:
        return {"source": self.source, "reader": self.reader, "ok": self.ok, "error": self.error or None,
                "device": self.device, "bytes": self.bytes, "first_s": self.first_s, "best_s": self.best_s,
                "GBps": self.gbps, "via": list(self.via)}


def pairs(inv: Inventory) -> list[Pair]:
    """Every node of every decode replica against every node of every prefill replica (the router
    sends a request's prefill to any prefill replica and its decode to any decode replica, and each
    decode worker reads the KV of the prefill workers that hold its heads: with replicas of more than
    one node, or of different sizes, nodes other than the heads read too)."""
    if not FN.is_pd(inv):
        return []
    prefill = [k for k in range(len(inv.replicas)) if FN.role(inv, k) == "prefill"]
    decode = [k for k in range(len(inv.replicas)) if FN.role(inv, k) == "decode"]
    return [Pair(src, rdr, p, d) for p in prefill for d in decode
            for src in inv.replicas[p] for rdr in inv.replicas[d]]


def device(inv: Inventory) -> str:
    """The KV buffer's memory, as FP.kv_transfer_config gives it to vLLM."""
    return "cuda" if inv.cluster.accelerator == "gpu" else "cpu"


def _common(inv: Inventory, ucx: Mapping[str, str], port: int | None) -> list[str]:
    return ["--port", str(port or inv.cluster.ports.kv_transfer), "--device", device(inv), "--mib", str(MIB),
            "--blocks", str(BLOCKS), "--rounds", str(ROUNDS), "--timeout", str(TIMEOUT_S),
            *[a for k, v in sorted(ucx.items()) for a in ("--env", f"{k}={v}")]]


def source_args(inv: Inventory, pair: Pair, ucx: Mapping[str, str], port: int | None = None) -> list[str]:
    """The prefill head's side; port: the side channel's (default cluster.ports.kv_transfer)."""
    return ["source", "--ip", pair.source.ip, *_common(inv, ucx, port)]


def reader_args(inv: Inventory, pair: Pair, ucx: Mapping[str, str], port: int | None = None) -> list[str]:
    """The decode head's side, which also prints UCX's protocol tables (PROTO_INFO) for read_protocols."""
    return ["reader", "--ip", pair.reader.ip, "--peer", pair.source.ip, *_common(inv, {**PROTO_INFO, **ucx}, port)]


def read_protocols(text: str) -> tuple[str, ...]:
    """The transports of UCX's "remote memory read" protocols in its UCX_PROTO_INFO tables, as
    "config (description)" in the order first seen, e.g. ("tcp/eth0 (software emulation)",) or
    ("rc_mlx5/mlx5_0:1 (zero-copy)",). UCX prefixes each table line with a timestamp and the
    process; a table's rows follow its title and header."""
    found: list[str] = []
    in_read = False
    for line in (text or "").splitlines():
        body = line[line.find("|"):] if "|" in line else ""
        if not body:
            if "+--" not in line:
                in_read = False
            continue
        if _READ_TITLE.search(body):
            in_read = True
            continue
        if "Range" in body and "Config" in body:  # the header row
            continue
        row = _ROW.search(body)
        if row is None:
            if "remote memory" in body or "active message" in body or "cfg#" in body:
                in_read = False
            continue
        if in_read:
            item = f"{row['config']} ({row['desc']})" if row["desc"] else row["config"]
            if row["config"] and item not in found:
                found.append(item)
    return tuple(found)


def _events(text: str) -> list[dict]:
    found = []
    for line in (text or "").splitlines():
        at = line.find('{"event"')  # a line of another writer may precede it on the same line
        if at >= 0:
            try:
                obj = json.loads(line[at:])
            except ValueError:
                continue
            if isinstance(obj, dict) and "event" in obj:
                found.append(obj)
    return found


def log_lines(text: str, n: int = 8) -> list[str]:
    """The last n lines of one side's output worth showing: its own lines and the warnings and
    errors of UCX and NIXL, without UCX's protocol tables or NIXL's INFO lines."""
    keep = []
    for line in (text or "").splitlines():
        s = line.strip()
        if not s or "NIXL INFO" in s or (s.startswith("[") and ("|" in s or "+--" in s)):
            continue
        keep.append(s)
    return keep[-n:]


def _failure(events: Sequence[dict], side: str, rc: int | None, tail: str) -> str:
    bad = [e for e in events if e.get("event") == "phase" and e.get("ok") is False]
    if bad:
        return f"{bad[-1].get('phase')} on the {side} side: {bad[-1].get('error')}"
    done = [e.get("phase") for e in events if e.get("event") == "phase"]
    last = tail.strip().splitlines()[-1] if tail.strip() else "no output"
    after = f" after {done[-1]}" if done else ""
    return f"the {side} side stopped{after} (exit {rc}): {last}"


def parse(pair: Pair, source_out: str, source_rc: int | None, reader_out: str, reader_rc: int | None,
          reader_log: str = "") -> PairResult:
    """Both sides' output -> the pair's result. The reader's result line carries the figures; the
    source's says the notification arrived (vLLM frees the prefill's blocks on it); UCX's tables
    (on the reader's stderr, reader_log, or in its output) say which transport the reads used."""
    src, rdr = _events(source_out), _events(reader_out)
    src_res = next((e for e in reversed(src) if e.get("event") == "result"), None)
    rdr_res = next((e for e in reversed(rdr) if e.get("event") == "result"), None)
    names = {"source": pair.source.name, "reader": pair.reader.name}
    if not (rdr_res and rdr_res.get("ok") and reader_rc == 0):
        return PairResult(**names, ok=False, error=_failure(rdr, "decode", reader_rc, reader_out))
    if not (src_res and src_res.get("ok") and source_rc == 0):
        return PairResult(**names, ok=False, error=_failure(src, "prefill", source_rc, source_out))

    def num(key: str) -> float | None:
        v = rdr_res.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    size = num("bytes")
    return PairResult(**names, ok=True, device=rdr_res.get("device"), bytes=int(size) if size is not None else None,
                      first_s=num("first_s"), best_s=num("best_s"), gbps=num("GBps"),
                      via=read_protocols(reader_out + "\n" + reader_log))
