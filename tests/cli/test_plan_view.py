"""`plan` as a reader takes it in (face/planview.py): the head's docker run whole, every other host as what
differs from it, the secrets' wrapper shown once (issue 51.8)."""
from __future__ import annotations

from bootstrap import face
from bootstrap.face import planview as PV
from tests.support.fleet_inventories import ENVIRON, hosts_yaml, load

CLUSTER = "cluster:\n  accelerator: none\n  secrets: [HF_TOKEN]\n  env: {NCCL_DEBUG: INFO}\n"


def test_the_head_is_whole_and_each_worker_is_what_differs_from_it(tmp_path):
    inv = load(tmp_path, CLUSTER + hosts_yaml(3), environ=ENVIRON)
    actions = face.plan(inv).actions
    head, w1, w2 = PV.views(actions)
    assert head.argv is not None and head.differs is None and PV.WRAPPER in head.argv
    assert PV.wrapper_script() not in head.argv  # the 400-character script is said once, not per host
    assert (w1.argv, w2.argv) == (None, None)
    base, own, gone, runs = w1.differs
    assert base == "h0" and ("-e", f"VLLM_HOST_IP={inv.hosts[1].ip}") in own
    assert ("--label", "bootstrap.host=h1") in own and ("--label", "bootstrap.role=worker") in own
    assert gone == () and runs is not None and runs != head.runs  # a worker's ray start is not the head's
    assert [v.ip for v in (head, w1, w2)] == [h.ip for h in inv.hosts]
    # what is the same on every host is not repeated: the env the cluster sets for all
    assert not [it for it in own if it == ("-e", "NCCL_DEBUG=INFO")]


def test_an_option_the_head_has_and_a_worker_lacks_is_named(tmp_path):
    inv = load(tmp_path, CLUSTER + hosts_yaml(2, {1: "env: {NCCL_DEBUG: WARN}"}), environ=ENVIRON)
    _, w = PV.views(face.plan(inv).actions)
    _, own, gone, _ = w.differs
    assert ("-e", "NCCL_DEBUG=WARN") in own and gone == ()  # replaced, not lacking
    assert PV.shown(("a", PV.wrapper_script(), "b")) == ("a", PV.WRAPPER, "b")
