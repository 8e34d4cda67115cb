"""`drain HOST` / `undrain HOST` without a host (fleet/drain.py, steps.back_in_router): what is refused
before anything is contacted, and how a drained replica is kept out of the routers. The real run, under
load, is in tests/sandbox/test_sandbox_zfleet.py."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from bootstrap.cli import main
from bootstrap.errors import FleetError
from bootstrap.fleet import drain as FDR
from bootstrap.fleet import steps as FST
from tests.support.fleet_inventories import fleet_yaml, load, write


def test_drain_needs_a_fleet_of_one_model_and_a_host_of_it(tmp_path):
    with pytest.raises(FleetError, match="one replica and no router"):
        FDR.check(load(tmp_path, fleet_yaml(2, replicas=1)), "h0", "drain")
    inv = load(tmp_path, fleet_yaml(4, replicas=2))
    with pytest.raises(FleetError, match=r"undrain: no host 'h9' in the inventory \(hosts: h0, h1, h2, h3\)"):
        FDR.check(inv, "h9", "undrain")
    assert [FDR.check(inv, h, "drain") for h in ("h0", "h1", "h2", "h3")] == [0, 0, 1, 1]


def test_the_cli_refuses_an_unknown_host_in_one_line_before_any_host_is_contacted(tmp_path, no_hosts):
    path = write(tmp_path, fleet_yaml(4, replicas=2))
    for verb in ("drain", "undrain"):
        r = CliRunner().invoke(main, [verb, "-i", str(path), "nosuch"])
        assert r.exit_code == 2 and r.stderr.strip().count("\n") == 0, r.stderr
        assert f"{verb}: no host 'nosuch' in the inventory" in r.stderr


def test_a_drained_replica_is_not_put_back_in_the_routers(tmp_path, monkeypatch):
    inv = load(tmp_path, fleet_yaml(4, replicas=2))
    calls = []
    monkeypatch.setattr(FST, "_in_router", lambda sess, inv, k, add: calls.append((k, add)) or {"ok": True})
    monkeypatch.setattr(FST, "drained_hosts", lambda sess, hosts: [h.name for h in hosts if h.name == "h3"])
    assert FST.back_in_router(None, inv, 1) == {"ok": True, "drained": ["h3"]} and calls == []
    assert FST.back_in_router(None, inv, 0) == {"ok": True} and calls == [(0, True)]


def test_the_drain_result_says_what_happened_in_json_too():
    res = FDR.DrainResult("h2", 1, "http://10.0.0.3:8000", True, "no request running or waiting for 2s", 3.14159)
    assert json.loads(json.dumps(res.to_dict())) == {"host": "h2", "replica": 1, "url": "http://10.0.0.3:8000",
                                                     "done": True, "why": "no request running or waiting for 2s",
                                                     "seconds": 3.14, "still_drained": []}


def test_the_mark_is_read_as_present_absent_or_an_error_never_absent_when_docker_fails(tmp_path):
    from types import SimpleNamespace

    from tests.support.fake_hosts import DOCKER_DOWN, FakeHost

    inv = load(tmp_path, fleet_yaml(4, replicas=2))
    h = inv.host("h2")
    for answer, want in (((0, "bootstrap-vllm-drained\n", ""), True),
                         ((1, "[]", "Error: No such volume: bootstrap-vllm-drained"), False)):
        sess = SimpleNamespace(inv=inv, ssh={"h2": FakeHost("h2", [("volume", answer)])})
        assert FST.is_drained(sess, h) is want
    sess = SimpleNamespace(inv=inv, ssh={"h2": FakeHost("h2", [("volume", DOCKER_DOWN)])})
    with pytest.raises(Exception, match="h2: `docker volume inspect` failed"):
        FST.is_drained(sess, h)
