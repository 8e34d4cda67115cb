"""The endpoint survives losing a host: 3 replicas (one node each) on the 3-node sandbox, vllm-router on
node1 and node2, a floating address held by keepalived on one of them (cluster.router.vip).

Real parts: keepalived (Debian's) sending VRRP between the nodes, the address on the node's eth0
answered by ARP on the sandbox's bridge, iptables forwarding it to the router, vllm-router, vLLM. A
host's loss is `docker kill` of its whole node container (every process on it at once).
"""
import ipaddress
import json
import os
import subprocess
import threading
import time

import pytest

from bootstrap.containers import SECRETS_ENTRY
from tests.support.fleet_load import MODEL, Load, complete, status, wait_answering
from tests.support.sandbox import cli, on_node, write_inventory

pytestmark = pytest.mark.sandbox
FLAGS = ["--enforce-eager", "--max-model-len", "256"]
ROUTERS = ("node1", "node2")
VIP_CONTAINER = "bootstrap-vllm-vip"
ROUTER = "bootstrap-vllm-router"
#: the fleet's secrets (set in the fixture): a workload's secret, and the API key's (cluster.router.api_key)
WORK, KEY_SECRET = "VIP_WORK_TOKEN", "VIP_FLEET_KEY"
KEY = "sk-vip-" + os.urandom(6).hex()


def holds(node, vip):
    """Whether the node's eth0 has the address now (asked of its kernel, not of bootstrap)."""
    r = on_node(node, "ip", "-o", "-4", "addr", "show", "dev", "eth0", check=False)
    return f" {vip}/" in r.stdout


def wait_for_holder(nodes, vip, deadline=30.0, step=0.05):
    """(node, seconds) once one of `nodes` holds the address; (None, seconds) at the deadline."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline:
        for n in nodes:
            if holds(n, vip):
                return n, time.monotonic() - t0
        time.sleep(step)
    return None, time.monotonic() - t0


@pytest.fixture(scope="module")
def vipfleet(_sandbox_session, tmp_path_factory):
    from bootstrap import sandbox as S
    from tests.support.sandbox import shared_sandbox

    sb = S.sandbox_up(3, log=lambda m: print(f"sandbox: {m}", flush=True), **shared_sandbox())
    vip = str(ipaddress.ip_network(sb.subnet)[250])  # no sandbox container is given .250

    def mutate(doc):
        doc["cluster"]["replicas"] = 3
        doc["cluster"]["router"] = {"policy": "round_robin", "health_interval": 2, "vip": {"address": vip},
                                    "api_key": KEY_SECRET}
        doc["cluster"]["secrets"] = [WORK, KEY_SECRET]
    os.environ.update({WORK: "work-" + os.urandom(6).hex(), KEY_SECRET: KEY})  # the CLI reads them from there
    inv = write_inventory(sb.inventory, tmp_path_factory.mktemp("vip") / "vip.yaml", mutate)
    r = cli("up", "--yes", "-i", inv)
    assert r.returncode == 0, r.stderr[-3000:]
    served = cli("serve", "-i", inv, MODEL, "--", *FLAGS)
    assert served.returncode == 0, served.stderr[-3000:]
    yield sb, inv, served, vip
    for n in sb.nodes:  # a node killed by a failed test comes back for `down` and the modules after
        subprocess.run(["docker", "start", n.container], capture_output=True, timeout=120)
    r = cli("down", "--yes", "-i", inv)
    assert r.returncode == 0, r.stderr[-2000:]
    for n in sb.nodes:  # keepalived gave the address up and its forwarding is gone with it
        assert not holds(n, vip), n.name
        nat = on_node(n, "iptables", "-t", "nat", "-S").stdout
        assert "bootstrap-vip" not in nat, (n.name, nat)
        left = on_node(n, "docker", "ps", "-a", "--format", "{{.Names}}").stdout.split()
        assert not [c for c in left if c.startswith("bootstrap-vllm-")], (n.name, left)
    for name in (WORK, KEY_SECRET):
        os.environ.pop(name, None)


def nodes_by_name(sb):
    return {n.name: n for n in sb.nodes}


def test_each_kind_of_container_holds_exactly_the_secrets_it_uses(vipfleet):
    """Every running container of ours on every node, read from the inside (names only, never a value):
    its PID 1's environment and its mounted secrets directory hold exactly the secrets its kind uses,
    as cluster/secretstore.py's KINDS says (the table the plan mounts the sets from): the node
    containers the workload's secret only, the serve containers and their standbys it and the API key
    as VLLM_API_KEY, the router the key only, keepalived and the keeper none (no VRRP password here:
    VRRPv2's slower adverts would miss this module's failover bounds; tests/cluster/test_secretstore.py
    covers it). The API key's own secret (VIP_FLEET_KEY) is in no container."""
    from bootstrap.cluster.guard import secretstore as SS
    from bootstrap.fleet import names as FN
    from bootstrap.inventory import load_inventory

    sb, inv, _, _ = vipfleet
    fleet = load_inventory(inv, require_secrets=False)
    kind_of = {fleet.cluster.container_name: "node", FN.serve_name(fleet): "serve",
               FN.standby_name(fleet): "standby", FN.router_name(fleet): "router", FN.vip_name(fleet): "keepalived",
               FN.keeper_name(fleet): "keeper"}
    secret_names = {s.name for s in fleet.cluster.secrets} | {SS.API_KEY_ENV}
    read = (f"ls -A {SS.IN_CONTAINER} 2>/dev/null; echo ---; "
            "tr '\\0' '\\n' < /proc/1/environ | cut -d= -f1")
    seen, read_env = set(), set()
    for n in sb.nodes:
        for name in on_node(n, "docker", "ps", "--format", "{{.Names}}").stdout.split():
            if name not in kind_of:
                continue
            kind = kind_of[name]
            mounted, _, env = on_node(n, "docker", "exec", name, "sh", "-c", read).stdout.partition("---\n")
            want = set(SS.kind_names(fleet, kind))
            assert set(mounted.split()) == want, (n.name, name, mounted.split(), want)
            # What the entrypoint exports: the names between `bootstrap-secrets` and `--` of its argv.
            args = json.loads(on_node(n, "docker", "inspect", "--format", "{{json .Args}}", name).stdout)
            exported = set(args[args.index(SECRETS_ENTRY) + 1:args.index("--")]) if SECRETS_ENTRY in args else set()
            assert exported == want, (n.name, name, sorted(exported), want)
            # And what PID 1 holds, where it can be read: vllm-router (and vLLM) call setproctitle, which
            # zeroes the environ block /proc/1/environ shows (read as nothing but NULs).
            if env.split():
                assert set(env.split()) & secret_names == want, (n.name, name, sorted(set(env.split()) & secret_names))
                read_env.add(kind)
            seen.add(kind)
    assert seen == set(kind_of.values()), seen
    # The image mirror (it runs only during a cold `up`): started on node1 with the tool's own argv, as
    # `up` starts it for this inventory, and read from Docker's record: no secrets directory mounted, no
    # entrypoint exporting one, no secret's name in its environment.
    from bootstrap.cluster.imagedist import plan as MR
    head, mirror_image = sb.nodes[0], fleet.cluster.image_mirror
    on_node(head, "docker", "pull", "-q", mirror_image)
    on_node(head, *MR.prepare_argv(mirror_image))
    conf = MR.nginx_conf(MR.split_image(fleet.cluster.image).registry, False, head.ip,
                         fleet.cluster.ports.image_copy, [n.ip for n in sb.nodes])
    try:
        on_node(head, *MR.run_argv(mirror_image, conf))
        spec = json.loads(on_node(head, "docker", "inspect", MR.CONTAINER).stdout)[0]
        assert not [m for m in spec["Mounts"] if m.get("Source", "").startswith(SS.HOST_ROOT)], spec["Mounts"]
        assert SECRETS_ENTRY not in spec["Args"], spec["Args"]
        env_names = {e.split("=", 1)[0] for e in spec["Config"]["Env"]}
        assert not env_names & (secret_names | {KEY_SECRET}), env_names
        assert set(SS.KINDS["mirror"][1]) == set(), SS.KINDS["mirror"]
    finally:
        on_node(head, *MR.remove_argv(), check=False)
    assert read_env, "no container's /proc/1/environ could be read"
    assert set(SS.kind_names(fleet, "node")) == {WORK} and KEY_SECRET not in str([SS.kind_names(fleet, k)
                                                                                   for k in SS.KINDS])


def test_three_replicas_serve_through_the_floating_address_and_a_stuck_router_gives_it_up(vipfleet):
    sb, inv, served, vip = vipfleet
    nodes = nodes_by_name(sb)
    endpoint = f"http://{vip}:30000/v1"
    assert f"serving {MODEL} on {endpoint} " in served.stdout and "floating address" in served.stdout
    assert complete(endpoint, "The quick brown fox", KEY)
    st = status(inv)
    routers = {r["host"]: r for r in st["routers"]}
    assert sorted(routers) == list(ROUTERS)
    urls = sorted(r["url"] for r in st["replicas"])
    for rv in routers.values():  # every router knows every replica
        assert rv["state"] == "running" and rv["vip_state"] == "running", rv
        assert sorted(rv["workers"]) == urls, rv
    holder = [n for n in ROUTERS if holds(nodes[n], vip)]
    assert len(holder) == 1 and st["vip_holder"] == holder[0], (holder, st["vip_holder"])
    assert [routers[n]["holds_vip"] for n in ROUTERS] == [n == holder[0] for n in ROUTERS]
    assert not holds(nodes["node3"], vip)
    assert all(r["health"] == "healthy" and r["in_rotation"] for r in st["replicas"])
    # a router that stops answering (its process frozen, the host fine) loses the address within 3 s
    other = next(n for n in ROUTERS if n != holder[0])
    on_node(nodes[holder[0]], "docker", "pause", ROUTER)
    try:
        t0 = time.monotonic()
        got, took = wait_for_holder([nodes[other]], vip, deadline=10)
        print(f"stuck router on {holder[0]}: the address on {other} after {took:.2f}s")
        assert got is not None and took <= 3.0, took
        assert complete(endpoint, "The quick brown fox", KEY)
    finally:
        on_node(nodes[holder[0]], "docker", "unpause", ROUTER)
    time.sleep(3)  # the unpaused router answers again; no preemption: the address stays where it is
    assert holds(nodes[other], vip) and not holds(nodes[holder[0]], vip), time.monotonic() - t0


def test_losing_the_router_host_moves_the_address_and_fails_only_what_was_on_it(vipfleet):
    """Under continuous load the host that holds the address is killed whole: the other router host
    takes the address over, no request sent after that fails, and the replica on the dead host is out
    of the surviving router's rotation; the host comes back and rejoins without a command."""
    sb, inv, served, vip = vipfleet
    nodes = nodes_by_name(sb)
    endpoint = f"http://{vip}:30000/v1"
    dead = next(n for n in ROUTERS if holds(nodes[n], vip))
    alive = next(n for n in ROUTERS if n != dead)
    with Load(endpoint, concurrency=4, max_tokens=48, pause=0.1, key=KEY) as load:
        time.sleep(8)
        t_kill = time.time()
        killed = {}

        def kill():  # `docker kill` returns once the container has stopped: when the host is dead
            subprocess.run(["docker", "kill", nodes[dead].container], stdout=subprocess.DEVNULL)
            killed["t"] = time.time()

        killer = threading.Thread(target=kill)
        killer.start()
        got, took = wait_for_holder([nodes[alive]], vip, deadline=15, step=0.02)
        t_move = time.time()
        killer.join(timeout=120)
        time.sleep(25)
    assert got is not None, f"{alive} never took the address over"
    before = [s for s in load.samples if s.started < t_kill]
    window = [s for s in load.samples if t_kill <= s.started < t_move]
    after = [s for s in load.samples if s.started >= t_move]
    failed = [s for s in load.samples if not s.ok]
    print(f"{dead} killed; the address on {alive} after {took:.2f}s; requests: {len(load.samples)}, "
          f"failed {len(failed)}: in flight at the kill {sum(not s.ok for s in before)} of {len(before)}, "
          f"sent to the dying host before the move {sum(not s.ok for s in window)} of {len(window)}, "
          f"sent after the move {sum(not s.ok for s in after)} of {len(after)}")
    for s in failed:
        print(f"  sent {s.started - t_kill:+.2f}s, ended {s.started + s.e2e - t_kill:+.2f}s: {s.error}")
    # The bound is on the failover, counted from the host's death: on two busy cores `docker kill` of a
    # node that runs its own Docker daemon takes seconds before the host stops (3.1 s from the kill's
    # start in one CI run, the address on the other host 1.1 s after the host stopped).
    moved_after_death = t_move - killed["t"]
    print(f"the host stopped {killed['t'] - t_kill:.2f}s after the kill began; the address moved "
          f"{moved_after_death:+.2f}s after that")
    assert moved_after_death <= 3.0, (took, moved_after_death)
    assert len(after) > 20 and not [s for s in after if not s.ok], [s.error for s in after if not s.ok][:5]
    # those that failed were all on the dead host: sent before the address moved, ended by the kill
    assert all(s.started < t_move for s in failed)
    assert all(s.started + s.e2e < t_move + 1.0 for s in failed), [(s.started, s.e2e) for s in failed]
    st = status(inv)  # a host that is down is shown as such; the view is the surviving router's
    assert st["vip_holder"] == alive
    routers = {r["host"]: r for r in st["routers"]}
    assert routers[dead]["state"].startswith("unknown"), routers[dead]
    reps = {r["hosts"][0]: r for r in st["replicas"]}
    assert reps[dead]["health"].startswith("unknown") and reps[dead]["router_healthy"] is False, reps[dead]
    assert all(reps[n]["health"] == "healthy" for n in reps if n != dead)

    # the host comes back: its containers restart, its replica rejoins every router, the address stays
    t0 = time.monotonic()
    subprocess.run(["docker", "start", nodes[dead].container], check=True, capture_output=True, timeout=120)
    # Its /run is a tmpfs: the restart emptied it, as a reboot does, and its containers that hold secrets
    # wait for them (exit 78, naming `bootstrap up`). The secrets are put back with `up`'s own write step
    # (secretstore.write_argv), then nothing else is run.
    from bootstrap.cluster.guard import secretstore as SS
    from bootstrap.inventory import load_inventory
    fleet = load_inventory(inv)
    subprocess.run(["docker", "exec", "-i", nodes[dead].container, *SS.write_argv(fleet.cluster.name, prune=False)],
                   input=SS.write_body(SS.files(fleet)), check=True, capture_output=True, timeout=60)
    wait_answering([r["url"] for r in st["replicas"]], 300)  # its vLLM first, without `status` on the cores
    while True:
        st = status(inv)
        routers = {r["host"]: r for r in st["routers"]}
        if (all(r["health"] == "healthy" and r["router_healthy"] for r in st["replicas"])
                and routers[dead]["state"] == "running" and routers[dead]["vip_state"] == "running"):
            break
        assert time.monotonic() - t0 < 300, json.dumps(st)[-3000:]
        time.sleep(5)
    print(f"{dead} back and its replica in rotation {time.monotonic() - t0:.0f}s after its start")
    urls = sorted(r["url"] for r in st["replicas"])
    assert sorted(routers[dead]["workers"]) == urls and sorted(routers[alive]["workers"]) == urls
    assert st["vip_holder"] == alive and holds(nodes[alive], vip) and not holds(nodes[dead], vip)
    assert complete(endpoint, "The quick brown fox", KEY)
