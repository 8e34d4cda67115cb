"""Which runtime a cluster's containers run: Ray (`ray start`) or none (vLLM's native multi-node mode).

`cluster.runtime` set in the inventory is honoured as written. Left unset, it follows the image:
`up` runs Ray where the image has it and the native mode where it does not (stock vllm/vllm-openai
images stopped shipping Ray), and records the choice in the containers it starts, where every
later command reads it back (the container's entrypoint: `ray` or `sleep`). The decisions here are
pure; `decide_from_image` and `settle` do the remote reads through the session.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from bootstrap.cluster import facts as F
from bootstrap.model import Inventory

#: The plan's word for a runtime not yet decided (no host contacted, or the image not on any host).
UNDECIDED = "ray or none, decided from the image"


def resolved(inv: Inventory, runtime: str) -> Inventory:
    """The inventory with cluster.runtime set to `runtime`."""
    if inv.cluster.runtime == runtime:
        return inv
    return replace(inv, cluster=replace(inv.cluster, runtime=runtime))


def of_container(st: F.ContainerState | None) -> str | None:
    """What a node container runs: "ray" (`ray start ...`), "none" (`sleep infinity`), None (not a
    bootstrap node container, or none there)."""
    if st is None:
        return None
    return {"ray": "ray", "sleep": "none"}.get(st.path)


def from_containers(inv: Inventory, states: Mapping[str, object]) -> Inventory:
    """runtime unset: what the running node containers run (the head's first); the inventory as it
    is when the runtime is set or no container tells."""
    if inv.cluster.runtime is not None:
        return inv
    order = [inv.head.name, *(h.name for h in inv.workers)]
    for name in order:
        st = states.get(name)
        rt = of_container(st) if isinstance(st, F.ContainerState) else None
        if rt is not None:
            return resolved(inv, rt)
    return inv


def image_hosts(facts: Mapping[str, F.HostFacts]) -> dict[str, str]:
    """Image ID -> the first host that has it (the image can differ between hosts under one tag)."""
    out: dict[str, str] = {}
    for name, f in facts.items():
        if f.image_id:
            out.setdefault(f.image_id, name)
    return out


def known_from_markers(facts: Mapping[str, F.HostFacts]) -> dict[str, bool]:
    """Image ID -> whether it has Ray, for the IDs some host checked before (its markers): IDs are
    content hashes, so the same ID is the same content."""
    has = {m for f in facts.values() for m in f.ray_ok}
    lacks = {m for f in facts.values() for m in f.ray_none}
    out: dict[str, bool] = {}
    for iid in image_hosts(facts):
        if F.ray_ok_marker(iid) in has:
            out[iid] = True
        elif F.ray_none_marker(iid) in lacks:
            out[iid] = False
    return out


def choose(has_ray: Mapping[str, bool], host_of: Mapping[str, str], image: str) -> tuple[str, str]:
    """(runtime, why) from whether each image ID on the hosts has Ray: Ray only when every one has."""
    if not has_ray:
        return "none", f"the image {image} is on no host"
    missing = sorted(host_of[i] for i, ok in has_ray.items() if not ok)
    if missing:
        return "none", (f"the image has no Ray (checked on {', '.join(missing)}): vLLM's native multi-node "
                        "mode; cluster.runtime: ray needs an image with Ray")
    return "ray", "the image has Ray; cluster.runtime: none runs vLLM's native multi-node mode instead"
