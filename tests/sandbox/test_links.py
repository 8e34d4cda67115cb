"""The sandbox's rack-shaped links, pure parts: rates as tc writes them, the bucket, the script
run in each container's network namespace and the check of what tc then shows. The links
themselves are measured against real containers in test_sandbox_infra.py."""
from __future__ import annotations

import subprocess

import pytest
from click.testing import CliRunner

from bootstrap.cli import main
from bootstrap.sandbox import links as LK


@pytest.mark.parametrize("text,bits", [("100mbit", 100_000_000), ("1gbit", 1_000_000_000), ("2.5Gbit", 2_500_000_000),
                                       (" 800kbit ", None), ("1000kbit", 1_000_000), ("100gbit", 100_000_000_000)])
def test_rates_are_written_as_tc_writes_them_within_bounds(text, bits):
    if bits is None:
        with pytest.raises(ValueError, match="outside 1mbit..100gbit"):
            LK.parse_rate(text, "--node-link")
    else:
        assert LK.parse_rate(text, "--node-link") == bits


@pytest.mark.parametrize("text", ["100mb", "100", "fast", "", "1e3mbit", "-1gbit", "101gbit"])
def test_a_bad_rate_names_the_option_and_the_text(text):
    with pytest.raises(ValueError, match=r"^--registry-link: "):
        LK.parse_rate(text, "--registry-link")


def test_the_bucket_holds_ten_milliseconds_or_a_few_large_packets():
    assert LK.burst_bytes(1_000_000_000) == 1_250_000
    assert LK.burst_bytes(100_000_000) == 256 * 1024
    assert LK.human_rate(100_000_000) == "100mbit" and LK.human_rate(2_500_000_000) == "2.5gbit"


def test_the_shape_is_recorded_and_described():
    shape = LK.LinkShape(registry_bits=100_000_000, node_bits=None)
    assert LK.LinkShape.from_dict(shape.to_dict()) == shape
    assert LK.LinkShape.from_dict(None) == LK.NO_LINKS and not LK.NO_LINKS.shaped
    assert shape.describe() == "registry link 100mbit, node links unshaped"


def test_the_script_finds_the_interface_by_address_and_sets_or_clears_the_bucket():
    s = LK.shape_script("172.31.240.12", 1_000_000_000)
    assert "ip='172.31.240.12/'" in s
    assert 'tc qdisc replace dev "$dev" root tbf rate 1000000000bit burst 1250000 latency 50ms' in s
    clear = LK.shape_script("172.31.240.2", None)
    assert "tbf rate" not in clear and 'tc qdisc del dev "$dev" root' in clear
    # it is valid sh
    for script in (s, clear):
        assert subprocess.run(["sh", "-n", "-c", script]).returncode == 0


@pytest.mark.parametrize("line,bits,ok", [
    ("eth0: qdisc tbf 8004: root refcnt 3 rate 100Mbit burst 256Kb lat 50ms", 100_000_000, True),
    ("eth0: qdisc tbf 8003: root refcnt 3 rate 1Gbit burst 1250000b lat 50ms", 1_000_000_000, True),
    ("eth0: qdisc tbf 8003: root refcnt 3 rate 1Gbit burst 1250000b lat 50ms", 100_000_000, False),
    ("eth0: qdisc noqueue 0: root refcnt 2", 100_000_000, False),
    ("eth0: qdisc noqueue 0: root refcnt 2", None, True),
    ("eth0: qdisc tbf 8004: root refcnt 3 rate 100Mbit burst 256Kb lat 50ms", None, False),
    ("", 100_000_000, False),
])
def test_what_tc_shows_is_checked_against_the_wanted_rate(line, bits, ok):
    assert LK.shaped_line_ok(line, bits) is ok


@pytest.mark.parametrize("args,needle", [
    (["--registry-link", "100mb"], "--registry-link: '100mb' is not a rate"),
    (["--node-link", "0.5mbit"], "--node-link: '0.5mbit' is outside"),
    (["--mixed"], "--mixed needs --kind full and --nodes 3 or more"),
    (["--mixed", "--nodes", "3", "--kind", "sshd"], "--mixed needs --kind full and --nodes 3 or more"),
])
def test_sandbox_up_refuses_a_bad_rate_in_one_line_before_touching_docker(args, needle, monkeypatch):
    from bootstrap import sandbox as S

    monkeypatch.setattr(S, "sandbox_up", lambda *a, **k: pytest.fail("sandbox_up was called"))
    r = CliRunner().invoke(main, ["sandbox", "up", "--nodes", "1", *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output


def test_a_mixed_rack_has_one_odd_node_described_by_its_docker_and_the_library_refuses_what_the_cli_does():
    from bootstrap.sandbox import layout as L

    hosts = [L.node_host(i, mixed=True) for i in (1, 2, 3, 4)]
    assert hosts == [L.HOST, L.HOST, L.MIXED_HOST, L.HOST] and [L.node_host(3, mixed=False)] == [L.HOST]
    odd, usual = L.SandboxNode("node3", "10.0.0.13", "c3", L.MIXED_HOST), L.SandboxNode("node1", "10.0.0.11", "c1")
    assert (odd.odd, odd.docker) == (True, "Docker 26.1, containerd image store")
    assert (usual.odd, usual.docker) == (False, "Docker 20.10, classic image store")
    assert L.mixed_refusal(3, "full") is None
    assert L.mixed_refusal(2, "full") == L.mixed_refusal(3, "sshd") == (
        "--mixed needs --kind full and --nodes 3 or more (node3 is the debian13 one)")
