"""The order the sandbox modules run in: each sandbox shape is built once.

Building a sandbox costs minutes (nodes start empty; the first `up` pulls the multi-GB vLLM image
into every node), and `sandbox_up` keeps a running sandbox of the same size or grows it, but a
smaller one is recreated. So the 2-node `infra` module, which also tests `sandbox down`, runs
first; every 3-node module then shares one sandbox (the floating-address fleet, `vip`, last of them), and the
4-node fleet grows it by one node last.
`cluster` comes first of those: its first test puts the image on the empty nodes with
`up --load-image` and peer copies, so no test before it pulls the image into all three.
"""
from __future__ import annotations

ORDER = ("infra", "cluster", "checks", "faults", "serve", "vip", "zfleet")


def _rank(item) -> int:
    stem = item.path.stem.removeprefix("test_sandbox_")
    return ORDER.index(stem) if stem in ORDER else len(ORDER)


def pytest_collection_modifyitems(session, config, items):
    """Stable: tests keep their order within a module, and other directories theirs."""
    sandbox = [i for i in items if i.path.parent.name == "sandbox"]
    if not sandbox:
        return
    first = items.index(sandbox[0])
    rest = [i for i in items if i.path.parent.name != "sandbox"]
    ordered = sorted(sandbox, key=_rank)
    items[:] = rest[:first] + ordered + rest[first:]
