"""What `status`, the exposure look and the image copy say when a remote step fails: the failure,
never a default that reads as an answer ("no" in Ray's column, "serving: nothing", no warning, a
wrong image left quietly). Fake hosts and monkeypatched sessions: no socket is opened."""
from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from bootstrap.cluster import ray as R
from bootstrap.cluster import run as A
from bootstrap.cluster.plan import RayView
from bootstrap.errors import CommandFailed, PreflightFailed, notes_of
from tests.support.fake_hosts import FakeHost, fake_session
from tests.support.fleet_inventories import hosts_yaml, load

INVENTORY = "cluster:\n  accelerator: none\n  runtime: ray\n" + hosts_yaml(2)
RUNNING = (0, (Path(__file__).resolve().parents[1] / "data" / "docker_container_inspect.json").read_text(), "")


def _status(tmp_path, monkeypatch, serving=None):
    inv = load(tmp_path, INVENTORY)
    monkeypatch.setattr(A, "Session", lambda inv, **kw: fake_session(
        inv, {"h0": FakeHost("h0", [("inspect", RUNNING)]), "h1": FakeHost("h1", [("inspect", RUNNING)])}, **kw))
    return inv, A.cluster_status(inv, serving=serving)


def _render(inv, st) -> str:
    from bootstrap.cli import render

    con = Console(file=io.StringIO(), width=300)
    old, render.out = render.out, con
    try:
        render.status(inv, st, False)
    finally:
        render.out = old
    return con.file.getvalue()


def test_status_says_why_rays_column_is_blind_when_the_head_cannot_be_asked(tmp_path, monkeypatch):
    def fails(sess, hosts, deadline):
        raise CommandFailed("h0", "docker exec -i vllm-node sh -c ... ray_nodes.py", None)
    monkeypatch.setattr(R, "ray_view", fails)
    inv, st = _status(tmp_path, monkeypatch)
    assert not any(n.ray_alive for n in st.nodes)
    assert st.ray_error.startswith("could not ask Ray on h0: h0: `docker exec") and "timed out" in st.ray_error
    assert "Ray: unknown: could not ask Ray on h0" in _render(inv, st)


def test_status_shows_rays_own_error_when_it_lists_no_node(tmp_path, monkeypatch):
    monkeypatch.setattr(R, "ray_view", lambda sess, hosts, deadline: RayView(
        False, (), ("10.0.0.1", "10.0.0.2"), "ConnectionError: GCS at 10.0.0.1:6379 not reachable"))
    _, st = _status(tmp_path, monkeypatch)
    assert "Ray on h0 did not list its nodes: ConnectionError: GCS" in st.ray_error


def test_status_says_serving_unknown_when_the_reader_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(R, "ray_view", lambda sess, hosts, deadline: RayView(True, (), ()))

    def reader(sess):
        raise CommandFailed("h0", "docker exec vllm-node serve_state.py", 126, "exec: python3: not found")
    inv, st = _status(tmp_path, monkeypatch, serving=reader)
    assert st.serving is None and "python3: not found" in st.serving_error
    out = _render(inv, st)
    assert "serving: unknown: h0:" in out and "serving: nothing" not in out


def test_exposure_says_when_the_heads_addresses_could_not_be_read(tmp_path):
    from bootstrap.cluster import probe

    inv = load(tmp_path, INVENTORY)
    sess = fake_session(inv, {"h0": FakeHost("h0", [("addr", (127, "", "sh: 1: hostname: not found"))]),
                              "h1": FakeHost("h1")})
    found = probe.exposure_warnings(sess)
    assert any(w.startswith("h0: could not list its addresses (sh: 1: hostname: not found)") for w in found)


def test_a_wrong_image_that_cannot_be_removed_is_said_beside_the_refusal():
    from bootstrap.cluster.imagedist.run import receive_image

    s = FakeHost("h1", [("docker load", (0, "Loaded image: img\n", "")),
                        ("image inspect", (0, '{"Id": "sha256:%s", "RootFS": {"Layers": ["sha256:%s"]}}\n'
                                           % ("b" * 64, "c" * 64), "")),
                        ("image rm", (1, "", "Error response from daemon: conflict: unable to remove repository "
                                            "reference \"img\" (must force) - container 0a1b is using it"))])
    with pytest.raises(PreflightFailed, match="refused") as ei:
        receive_image(s, "img", "content:" + "a" * 64, "h0", "10.0.0.1", 5000)  # another image (by content)
    notes = notes_of(ei.value)
    assert len(notes) == 1 and "h1: could not remove the wrong image img" in notes[0] and "conflict" in notes[0]
