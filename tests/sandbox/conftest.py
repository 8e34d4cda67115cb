"""The order the sandbox modules run in: each sandbox shape is built once.

Building a sandbox costs minutes (nodes start empty; the first `up` pulls the multi-GB vLLM image
into every node), and `sandbox_up` keeps a running sandbox of the same size or grows it, but a
smaller one is recreated. So the 2-node `infra` module, which also tests `sandbox down`, runs
first; every 3-node module then shares one sandbox (the floating-address fleet, `vip`, last of them), and the
4-node fleet grows it by one node last.
`cluster` comes first of those: its first test proves `up --load-image` and peer copies with a small
image, and its second test's `up` pulls the vLLM image into the empty nodes from the registry (three
concurrent pulls: the cheapest way here), so no test before them needs the image on the nodes.
"""
from __future__ import annotations

import pytest

ORDER = ("infra", "cluster", "checks", "faults", "serve", "vip", "zfleet", "zpool")


def _rank(item) -> int:
    stem = item.path.stem.removeprefix("test_sandbox_")
    return ORDER.index(stem) if stem in ORDER else len(ORDER)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the group marks
def pytest_collection_modifyitems(session, config, items):
    """Stable: tests keep their order within a module, and other directories theirs. Under
    pytest-xdist (scripts/test.sh: `-n 2 --dist loadgroup`) every test here is one group, run by one
    worker in this order, while the other worker runs the unit tests."""
    # the tests that use the sandbox (marked `sandbox`); the pure ones beside them (links, GPU shapes) run
    # on the other worker with the unit tests
    sandbox = [i for i in items if i.path.parent.name == "sandbox" and i.get_closest_marker("sandbox")]
    if not sandbox:
        return
    for item in sandbox:
        item.add_marker(pytest.mark.xdist_group("sandbox"))
    first = items.index(sandbox[0])
    rest = [i for i in items if i not in sandbox]
    ordered = sorted(sandbox, key=_rank)
    items[:] = rest[:first] + ordered + rest[first:]
