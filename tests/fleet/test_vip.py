"""Routers on two hosts behind a floating address (cluster.router.vip): the inventory's checks, the
plan (keepalived's configuration and container), its entry script run for real with sh, and the
configuration checked by keepalived itself (`keepalived -t`)."""
from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import textwrap

import pytest

from bootstrap.cluster.guard import fence as FN
from bootstrap.cluster.guard import secretstore as SS
from bootstrap.fleet import names as FN_
from bootstrap.fleet import plan as FP
from bootstrap.fleet import routers as FRT
from bootstrap.fleet.status import RouterView
from bootstrap.remote.session import check_script
from tests.support.fleet_inventories import error, fleet_yaml, line_of, load, write

VIP = "router: {vip: {address: 10.0.0.100}}"


def test_a_floating_address_puts_routers_on_the_first_two_replica_heads(tmp_path):
    inv = load(tmp_path, fleet_yaml(6, 3, cluster=VIP))
    assert [h.name for h in FN_.router_hosts(inv)] == ["h0", "h2"]
    assert FN_.router_url(inv) == "http://10.0.0.100:30000"  # the endpoint is the floating address
    assert FN_.router_url(inv, inv.host("h2")) == "http://10.0.0.3:30000"  # each router on its own IP
    assert FP.one_host_note(inv) is None
    # every router host's port is the endpoint in the fence; the others' is not
    assert [FN.endpoint_ports(inv, h) for h in inv.hosts] == [(30000,), (), (30000,), (), (), ()]
    one = FP.replica_inventory(inv, 1)
    assert FN.endpoint_ports(one, one.host("h2")) == (30000,)
    # hosts named: those
    inv = load(tmp_path, fleet_yaml(6, 3, cluster="router: {hosts: [h4, h1, h0], vip: {address: 10.0.0.100/24}}"))
    assert [h.name for h in FN_.router_hosts(inv)] == ["h4", "h1", "h0"]
    assert inv.cluster.router.vip.prefix == 24


def test_without_a_floating_address_the_plan_says_the_endpoint_is_one_host(tmp_path):
    inv = load(tmp_path, fleet_yaml(4, 2))
    assert [h.name for h in FN_.router_hosts(inv)] == ["h0"]
    note = FP.one_host_note(inv)
    assert note.startswith("the endpoint is one host (h0)") and "cluster.router.vip" in note
    plan = FP.plan_fleet(inv, FP.Spec("/m"), _split(), nofile={})
    assert note in plan.notes and plan.vip is None and [r.vip_create for r in plan.routers] == [()]


@pytest.mark.parametrize("router, field, words", [
    ("{vip: {address: 10.0.0.300}}", "cluster.router.vip.address", "is not an IPv4 address"),
    ("{vip: {address: 10.0.0.100/40}}", "cluster.router.vip.address", "prefix length (8-32)"),
    ("{vip: {address: 127.0.0.5}}", "cluster.router.vip.address", "loopback"),
    ("{vip: {address: 0.0.0.0}}", "cluster.router.vip.address", "unspecified"),
    ("{vip: {address: 10.0.0.2}}", "cluster.router.vip.address", "is the ip of h1"),
    ("{vip: {id: 7}}", "cluster.router.vip", "address is missing"),
    ("{vip: {address: 10.0.0.100, id: 0}}", "cluster.router.vip.id", ""),
    ("{vip: {address: 10.0.0.100, port: 1}}", "cluster.router.vip", "unknown key 'port'"),
    ("{vip: {address: 10.0.0.100, secret: NOPE}}", "cluster.router.vip.secret", "not listed in cluster.secrets"),
    ("{vip: {address: 10.0.0.100, secret: 'pass word'}}", "cluster.router.vip.secret", "not a secret's name"),
    ("{vip: {address: 10.0.0.100}, hosts: [h0]}", "cluster.router.hosts", "two hosts or more"),
    ("{vip: {address: 10.0.0.100}, host: h0}", "cluster.router.host", "use hosts"),
    ("{hosts: [h0, h2]}", "cluster.router.hosts", "need a floating address"),
    ("{hosts: [h0, h0], vip: {address: 10.0.0.100}}", "cluster.router.hosts", "listed twice"),
    ("{hosts: [h0, h9], vip: {address: 10.0.0.100}}", "cluster.router.hosts", "'h9' is not a host"),
    ("{host: h0, hosts: [h0, h2], vip: {address: 10.0.0.100}}", "cluster.router.hosts", "not both"),
])
def test_a_wrong_floating_address_is_one_line_naming_the_field(tmp_path, router, field, words):
    text = fleet_yaml(4, 2, cluster=f"router: {router}")
    err = error(tmp_path, text)
    msg = str(err)
    path = tmp_path / "inventory.yaml"
    assert msg.startswith(f"{path}:{line_of(path, 'router:')}: {field}"), msg
    assert words in msg and "\n" not in msg, msg


V6 = {0: "ip: '2001:db8::1'", 2: "ip: '2001:db8::3'"}


@pytest.mark.parametrize("address, extra, words", [
    ("169.254.0.100", None, "169.254.0.100 is a link-local address"),
    ("10.0.0.0/24", None, "10.0.0.0 is the network address of 10.0.0.0/24"),
    ("10.0.0.255/24", None, "10.0.0.255 is the broadcast address of 10.0.0.0/24"),
    ("10.0.1.100/24", None, "10.0.1.100/24 is not on router host h0's network: its ip 10.0.0.1 is outside 10.0.1.0/24"),
    ("10.0.0.2", {1: "ip: 10.0.0.50"}, "10.0.0.2 is the SSH address of h1"),
    ("10.0.0.100", V6, "10.0.0.100 is an IPv4 address and router host h0's ip 2001:db8::1 is IPv6"),
])
def test_a_floating_address_no_client_can_use_is_refused_offline(tmp_path, address, extra, words):
    text = fleet_yaml(4, 2, cluster=f"router: {{vip: {{address: '{address}'}}}}", extra=extra)
    err = error(tmp_path, text)
    msg = str(err)
    path = tmp_path / "inventory.yaml"
    assert msg.startswith(f"{path}:{line_of(path, 'router:')}: cluster.router.vip.address: "), msg
    assert words in msg and "\n" not in msg, msg


def test_a_floating_address_on_the_router_hosts_network_is_taken(tmp_path):
    for address in ("10.0.0.100/24", "10.0.0.254/24", "10.0.0.100", "10.0.0.100/16"):
        assert load(tmp_path, fleet_yaml(4, 2, cluster=f"router: {{vip: {{address: '{address}'}}}}")).cluster.router.vip
    # only the router hosts count: an IPv6 host that runs no router does not matter
    inv = load(tmp_path, fleet_yaml(4, 2, cluster="router: {vip: {address: 10.0.0.100/24}}",
                                    extra={1: "ip: '2001:db8::2'"}))
    assert inv.cluster.router.vip.prefix == 24


def _split():
    from bootstrap.serve.split import Parallelism, SplitChoice
    return SplitChoice(Parallelism(tp=2, pp=1, world=2), "TP=2 PP=1: one worker per node", True)


def _vip_inv(tmp_path, extra=""):
    return load(tmp_path, fleet_yaml(6, 3, cluster=f"name: demo\n{extra}router: {{hosts: [h0, h2, h4], vip: "
                                                  "{address: 10.0.0.100, id: 42}}"))


def test_keepalived_gets_unicast_peers_a_check_of_its_own_router_and_no_preemption(tmp_path):
    inv = _vip_inv(tmp_path)
    plan = FP.plan_fleet(inv, FP.Spec("/m"), _split(), nofile={}, ifaces={"h0": "eth0", "h2": "ens1", "h4": "eth0"})
    assert plan.vip == "10.0.0.100" and plan.endpoint == "http://10.0.0.100:30000/v1"
    assert [r.host for r in plan.routers] == ["h0", "h2", "h4"]
    r2 = plan.routers[1]
    assert "--host 10.0.0.3 " in " ".join(r2.run)  # each router bound to its own data-plane IP
    conf = r2.vip_config
    assert "unicast_src_ip 10.0.0.3" in conf and "check_unicast_src" in conf
    peers = conf.split("unicast_peer {")[1].split("}")[0].split()
    assert peers == ["10.0.0.1", "10.0.0.5"]
    assert "interface ens1" in conf and "10.0.0.100/32 dev ens1" in conf
    assert "virtual_router_id 42" in conf and "nopreempt" in conf and "state BACKUP" in conf
    assert "version 3" in conf and "advert_int 0.25" in conf and "auth" not in conf
    ask = "curl -fsS -m 0.7 -o /dev/null http://10.0.0.3:30000/readiness"
    assert f"script \"/bin/sh -c '{ask} || {ask}'\"" in conf and "fall 1" in conf
    prios = [int(r.vip_config.split("priority ")[1].split()[0]) for r in plan.routers]
    assert prios == sorted(prios, reverse=True) and len(set(prios)) == 3
    argv = r2.vip_create
    assert argv[argv.index("--network") + 1] == "host"
    caps = [argv[i + 1] for i, a in enumerate(argv) if a == "--cap-add"]
    assert sorted(caps) == ["NET_ADMIN", "NET_BROADCAST", "NET_RAW", "SETGID", "SETUID"]
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert "--privileged" not in argv and "-v" not in argv  # no secret set without a password
    assert FN_.vip_name(inv) in plan.keeper  # the keeper restarts keepalived too
    # an interface the facts do not know: refused, naming the host
    with pytest.raises(Exception) as info:
        FP.plan_fleet(inv, FP.Spec("/m"), _split(), nofile={}, ifaces={"h0": "eth0", "h2": None, "h4": "eth0"})
    assert str(info.value).startswith("h2: no interface holds its ip 10.0.0.3")


def test_a_floating_address_outside_a_router_hosts_network_from_its_facts_is_refused_before_anything_starts(tmp_path):
    from bootstrap.cluster import plan as PL
    from bootstrap.cluster.facts import HostFacts, parse_rack
    from bootstrap.errors import FleetError

    inv = load(tmp_path, fleet_yaml(4, 2, cluster=VIP))
    rack = parse_rack("== addr\n1: lo    inet 127.0.0.1/8 scope host lo\n"
                      "2: eth0    inet 10.0.0.3/25 brd 10.0.0.127 scope global eth0\n"
                      "2: eth0    inet6 2001:db8::3/64 scope global\n")
    assert PL.network_of(inv.host("h2"), HostFacts("27.0", rack=rack)) == "10.0.0.0/25"
    assert PL.network_of(inv.host("h0"), HostFacts("27.0", rack=rack)) is None  # not its ip
    ifaces = {"h0": "eth0", "h2": "eth0"}
    fine = FP.plan_fleet(inv, FP.Spec("/m"), _split(), nofile={}, ifaces=ifaces,
                         nets={"h0": "10.0.0.0/24", "h2": "10.0.0.0/24"})
    assert fine.vip == "10.0.0.100"
    for net, words in (("10.0.0.0/26", "10.0.0.100 is outside h2's network 10.0.0.0/26"),
                       ("10.0.0.96/30", "10.0.0.100 is outside h2's network 10.0.0.96/30"),
                       ("10.0.0.64/27", "10.0.0.100 is outside h2's network 10.0.0.64/27")):
        with pytest.raises(FleetError) as info:
            FP.plan_fleet(inv, FP.Spec("/m"), _split(), nofile={}, ifaces=ifaces, nets={"h0": "10.0.0.0/24", "h2": net})
        assert str(info.value).startswith("h2: the floating address ") and words in str(info.value), str(info.value)
    inv = load(tmp_path, fleet_yaml(4, 2, cluster="router: {vip: {address: 10.0.0.127}}"))
    with pytest.raises(FleetError) as info:
        FP.plan_fleet(inv, FP.Spec("/m"), _split(), nofile={}, ifaces=ifaces, nets={"h0": "10.0.0.0/25"})
    assert "10.0.0.127 is the broadcast address of h0's network 10.0.0.0/25" in str(info.value)


def test_a_vrrp_password_comes_from_a_secret_file_never_the_configuration(tmp_path):
    text = fleet_yaml(4, 2, cluster="secrets: [VRRP_PASS]\nrouter: {vip: {address: 10.0.0.100, secret: VRRP_PASS}}")
    inv = load(tmp_path, text, environ={"VRRP_PASS": "s3cr3tpw"})
    plan = FP.plan_fleet(inv, FP.Spec("/m"), _split(), nofile={}, ifaces={"h0": "eth0", "h2": "eth0"})
    conf = plan.routers[0].vip_config
    assert "version 2" in conf and "advert_int 1\n" in conf and f"include {FRT.VIP_RUN}/auth.conf" in conf
    assert "s3cr3tpw" not in conf and "s3cr3tpw" not in " ".join(plan.routers[0].vip_create)
    assert SS.vip_names(inv) == ("VRRP_PASS",)
    assert SS.files(inv)["vip/VRRP_PASS"] == "s3cr3tpw"
    argv = plan.routers[0].vip_create
    assert f"{SS.host_dir(inv.cluster.name)}/vip:{SS.IN_CONTAINER}:ro" in argv
    assert "router/VRRP_PASS" not in SS.files(inv)  # the router does not get it


@pytest.mark.skipif(shutil.which("keepalived") is None and not os.environ.get("CI"),
                    reason="keepalived is not installed (scripts/dev-setup.sh installs it; CI always has it)")
@pytest.mark.parametrize("secret", [False, True])
def test_keepalived_itself_accepts_the_configuration(tmp_path, secret):
    extra = "secrets: [VRRP_PASS]\n" if secret else ""
    vip = "{address: 10.0.0.100, secret: VRRP_PASS}" if secret else "{address: 10.0.0.100}"
    inv = load(tmp_path, fleet_yaml(4, 2, cluster=f"{extra}router: {{vip: {vip}}}"), environ={"VRRP_PASS": "pw"})
    conf = FRT.vip_config(inv, inv.host("h0"), "eth0").replace(f"{FRT.VIP_RUN}/auth.conf", str(tmp_path / "auth.conf"))
    (tmp_path / "auth.conf").write_text("authentication {\n    auth_type PASS\n    auth_pass pw\n}\n")
    path = write(tmp_path, conf, "keepalived.conf")
    r = subprocess.run(["keepalived", "-t", "-l", "-f", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    said = r.stdout + r.stderr
    assert "rounding" not in said and "Ignoring" not in said and "Unknown keyword" not in said, said


def _fake_tools(bindir: pathlib.Path, log: pathlib.Path, missing: str = "") -> None:
    """iptables, keepalived and curl that record their arguments (iptables -C finds what -I added)."""
    bindir.mkdir()
    tools = {
        "iptables": textwrap.dedent(f"""\
            #!/bin/sh
            echo "iptables $*" >> {log}
            rules={log}.rules; touch $rules
            args=$(echo "$*" | sed 's/ -[CID] / X /')
            case "$*" in
              *" -C "*) grep -qxF -- "$args" $rules ;;
              *" -I "*) echo "$args" >> $rules ;;
              *" -D "*) grep -vxF -- "$args" $rules > $rules.new; mv $rules.new $rules ;;
            esac
            """),
        "keepalived": textwrap.dedent(f"""\
            #!/bin/sh
            echo "keepalived $*" >> {log}
            trap 'echo "keepalived got TERM" >> {log}; exit 0' TERM
            while :; do sleep 0.1; done
            """),
        "curl": "#!/bin/sh\nexit 0\n",
    }
    for name, body in tools.items():
        if name != missing:
            (bindir / name).write_text(body)
            (bindir / name).chmod(0o755)


def _entry(tmp_path, *args, env=None, missing=""):
    log = tmp_path / "log"
    _fake_tools(tmp_path / "bin", log, missing)
    script = tmp_path / "vip_entry.sh"
    script.write_bytes(check_script("vip_entry.sh"))
    run = tmp_path / "run"
    run.mkdir()
    environ = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", **(env or {})}
    proc = subprocess.Popen(["sh", str(script), "10.0.0.100", "30000", "10.0.0.3", *args, "/etc/k.conf", str(run)],
                            env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group: a kill reaches its keepalived too
    return proc, log, run


def _wait_for(path: pathlib.Path, needle: str, seconds: float = 10) -> str:
    import time
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        text = path.read_text() if path.exists() else ""
        if needle in text:
            return text
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} not in {path}: {text!r}")


def test_the_entry_forwards_the_address_runs_keepalived_and_undoes_both_on_stop(tmp_path):
    proc, log, run = _entry(tmp_path, "")
    text = _wait_for(log, "keepalived --dont-fork")
    rule = ("-d 10.0.0.100/32 -p tcp --dport 30000 -m comment --comment bootstrap-vip -j DNAT "
            "--to-destination 10.0.0.3:30000")
    assert f"iptables -w 5 -t nat -I PREROUTING {rule}" in text and f"iptables -w 5 -t nat -I OUTPUT {rule}" in text
    assert not (run / "auth.conf").exists()
    proc.terminate()
    out, _ = proc.communicate(timeout=10)
    text = log.read_text()
    assert "keepalived got TERM" in text
    assert f"-t nat -D PREROUTING {rule}" in text and f"-t nat -D OUTPUT {rule}" in text
    assert (tmp_path / "log.rules").read_text() == ""  # nothing left behind
    assert "forwarding of 10.0.0.100:30000 removed" in out


def test_a_restart_does_not_add_the_forwarding_twice(tmp_path):
    for _ in range(2):
        proc, log, run = _entry(tmp_path, "")
        _wait_for(log, "keepalived --dont-fork")
        os.killpg(proc.pid, signal.SIGKILL)  # as `docker kill`: every process of it, no cleanup
        proc.wait(timeout=10)
        for p in ("bin", "run", "vip_entry.sh"):
            shutil.rmtree(tmp_path / p) if (tmp_path / p).is_dir() else (tmp_path / p).unlink()
    assert len((tmp_path / "log.rules").read_text().splitlines()) == 2  # one rule per chain, not four


def test_the_entry_writes_the_password_to_its_tmpfs_only_and_refuses_a_missing_one(tmp_path):
    proc, log, run = _entry(tmp_path, "VRRP_PASS", env={"VRRP_PASS": "pw'\"$x"})
    _wait_for(log, "keepalived --dont-fork")
    auth = run / "auth.conf"
    assert auth.read_text() == "authentication {\n    auth_type PASS\n    auth_pass pw'\"$x\n}\n"
    assert oct(auth.stat().st_mode & 0o777) == "0o600"
    assert "pw'" not in log.read_text()  # not on any command line
    proc.terminate()
    proc.communicate(timeout=10)
    (tmp_path / "x").mkdir()
    proc, log, run = _entry(tmp_path / "x", "VRRP_PASS")
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 78 and "the secret VRRP_PASS is not on this host: run bootstrap up" in err


def test_an_image_without_keepalived_stops_with_a_line_saying_so(tmp_path):
    proc, log, run = _entry(tmp_path, "", missing="keepalived")
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 78 and "keepalived is not in this image" in err


def test_router_view_round_trips_to_json():
    rv = RouterView("h0", "running", ["http://a"], "running", True)
    assert rv.to_dict() == {"host": "h0", "state": "running", "workers": ["http://a"], "vip_state": "running",
                            "holds_vip": True, "kv_lookups": None}
