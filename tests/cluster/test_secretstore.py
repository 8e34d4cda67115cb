"""Secrets as files on a tmpfs, never in Docker's records (cluster/guard/secretstore.py): the host-side
scripts and the container entrypoint run for real with sh; the argv of every container that gets
secrets carries names and mounts only."""
from __future__ import annotations

import os
import stat
import subprocess
import uuid
from pathlib import Path

import pytest

from bootstrap.cluster import plan as PL
from bootstrap.cluster.facts import HostFacts
from bootstrap.cluster.guard import fence as FN
from bootstrap.cluster.guard import secretstore as SS
from bootstrap.cluster.preflight import run as PR
from bootstrap.containers import LOAD_SECRETS, SECRETS_IN_CONTAINER
from bootstrap.inventory import load_inventory
from bootstrap.remote import docker as DK
from bootstrap.serve import split as SP

VALUE = "hf_" + "x" * 20 + "=tail ends in two spaces  "
KEY = "sk-" + uuid.uuid4().hex


def run(argv, stdin=b""):
    return subprocess.run(argv, input=stdin, capture_output=True, timeout=30)


@pytest.fixture
def memory_root():
    """A root of ours on a tmpfs (/dev/shm), removed afterwards."""
    if not Path("/dev/shm").is_dir() or run(["stat", "-f", "-c", "%T", "/dev/shm"]).stdout.strip() != b"tmpfs":
        pytest.fail("/dev/shm is not a tmpfs on this machine: the test needs one")
    root = Path("/dev/shm") / f"bootstrap-test-{uuid.uuid4().hex[:8]}"
    yield root
    subprocess.run(["rm", "-rf", str(root)])


def mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


def test_write_puts_each_value_in_a_0400_file_in_0700_dirs_and_prune_removes_the_rest(memory_root):
    root = str(memory_root)
    body = SS.write_body({"serve/HF_TOKEN": VALUE, "serve/OTHER": "o", "router/VLLM_API_KEY": KEY})
    r = run(SS.write_argv("c1", prune=True, root=root), body)
    assert r.returncode == 0, r.stderr
    d = memory_root / "c1"
    assert (d / "serve" / "HF_TOKEN").read_text() == VALUE and (d / "serve" / "OTHER").read_text() == "o"
    assert (d / "router" / "VLLM_API_KEY").read_text() == KEY
    assert mode(d / "serve" / "HF_TOKEN") == 0o400 and mode(d / "router" / "VLLM_API_KEY") == 0o400
    assert mode(d / "serve") == mode(d / "router") == mode(d) == mode(memory_root) == 0o700
    # add (a fleet's serve): OTHER stays; prune (up): OTHER goes, and so does a file of an older layout
    r = run(SS.write_argv("c1", prune=False, root=root), SS.write_body({"serve/VLLM_API_KEY": KEY}))
    assert r.returncode == 0 and sorted(os.listdir(d / "serve")) == ["HF_TOKEN", "OTHER", "VLLM_API_KEY"]
    (d / "OLD").mkdir()  # what Docker makes for a missing bind source (an older layout's file)
    r = run(SS.write_argv("c1", prune=True, root=root), SS.write_body({"serve/HF_TOKEN": "new",
                                                                       "serve/VLLM_API_KEY": KEY}))
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(d / "serve")) == ["HF_TOKEN", "VLLM_API_KEY"]
    assert (d / "serve" / "HF_TOKEN").read_text() == "new"
    assert os.listdir(d / "router") == [] and not (d / "OLD").exists()
    # no value on the command line: the argv names the directory only
    assert not any(VALUE in a or KEY in a for a in SS.write_argv("c1", prune=True, root=root))
    # remove: this cluster's directory, then the root when no other cluster is left in it
    run(SS.write_argv("c2", prune=True, root=root), SS.write_body({"serve/A": "a"}))
    assert run(SS.remove_argv("c1", root=root)).returncode == 0
    assert not d.exists() and (memory_root / "c2" / "serve" / "A").exists()
    assert run(SS.remove_argv("c2", root=root)).returncode == 0 and not memory_root.exists()
    assert run(SS.remove_argv("c2", root=root)).returncode == 0  # nothing there: nothing done


def test_write_refuses_a_place_on_disk_and_writes_nothing(tmp_path):
    root = tmp_path / "bootstrap"
    if run(["stat", "-f", "-c", "%T", str(tmp_path)]).stdout.strip() in (b"tmpfs", b"ramfs"):
        pytest.fail(f"{tmp_path} is in memory here: the test needs a place on disk")
    r = run(SS.write_argv("c1", prune=True, root=str(root)), SS.write_body({"serve/HF_TOKEN": VALUE}))
    assert r.returncode == 3 and b"is not a tmpfs" in r.stderr and b"rest on disk" in r.stderr
    assert not root.exists()


def test_the_entrypoint_exports_each_secret_and_refuses_to_start_without_one(tmp_path):
    (tmp_path / "A").write_text(VALUE)
    (tmp_path / "B").write_text("b=c")
    script = SS.entry_script(str(tmp_path))
    show = 'printf "%s|%s|%s" "$A" "$B" "$#"'
    r = run(["sh", "-c", script, "bootstrap-secrets", "A", "B", "--", "sh", "-c", show, "x", "1", "2"])
    assert r.returncode == 0 and r.stdout.decode() == f"{VALUE}|b=c|2", r.stderr
    r = run(["sh", "-c", script, "bootstrap-secrets", "A", "GONE", "--", "sh", "-c", "echo started"])
    assert r.returncode == SS.MISSING_EXIT and b"started" not in r.stdout
    assert b"the secret GONE is not on this host" in r.stderr and b"bootstrap up" in r.stderr
    assert VALUE.encode() not in r.stderr


def test_what_bootstrap_runs_with_docker_exec_reads_the_mounted_secrets_first(tmp_path):
    (tmp_path / "VLLM_API_KEY").write_text(KEY)
    load = LOAD_SECRETS.replace(SECRETS_IN_CONTAINER, str(tmp_path))
    r = run(["sh", "-c", load + '; printf %s "$VLLM_API_KEY"'])
    assert r.stdout.decode() == KEY
    empty = tmp_path / "none"
    r = run(["sh", "-c", LOAD_SECRETS.replace(SECRETS_IN_CONTAINER, str(empty)) + "; echo ok"])
    assert r.returncode == 0 and r.stdout == b"ok\n"
    assert any(LOAD_SECRETS in a for a in DK.exec_python_argv("c", []))


INV = """
cluster:
  name: sec
  image: vllm/vllm-openai:v0.32.0
  gpus_per_node: 1
  secrets: [HF_TOKEN, FLEET_KEY]
  replicas: 2
  router: {api_key: FLEET_KEY}
hosts:
  - {name: a, address: 10.0.0.1, ip: 10.0.0.1, role: head}
  - {name: b, address: 10.0.0.2, ip: 10.0.0.2}
"""


@pytest.fixture
def inv(tmp_path):
    p = tmp_path / "inv.yaml"
    p.write_text(INV)
    return load_inventory(str(p), check_files=False, environ={"HF_TOKEN": VALUE, "FLEET_KEY": KEY})


def test_no_container_argv_carries_a_value_and_each_mounts_only_its_own_secrets(inv):
    from bootstrap.fleet import plan as FP
    from bootstrap.fleet import routers as FRT

    assert SS.values(inv) == {"HF_TOKEN": VALUE, "FLEET_KEY": KEY, "VLLM_API_KEY": KEY}
    # FLEET_KEY (the API key's secret) reaches the containers as VLLM_API_KEY only, and no node container
    assert SS.files(inv) == {"node/HF_TOKEN": VALUE, "serve/HF_TOKEN": VALUE, "serve/VLLM_API_KEY": KEY,
                             "router/VLLM_API_KEY": KEY}
    node = PL.container_spec(FP.replica_inventory(inv, 0), inv.host("a"), 1024).run_argv()
    member = FP.member_create_argv(inv, inv.host("a"), 1024, replica=0, rank=0, nodes=1, vllm=["--x"],
                                   spec=FP.Spec("m"))
    router = FRT.router_run_argv(inv, ["http://10.0.0.1:8000"])
    for argv, names, which in ((node, ["HF_TOKEN"], "node"),
                               (member, ["HF_TOKEN", "VLLM_API_KEY"], "serve"),
                               (router, ["VLLM_API_KEY"], "router")):
        assert not any(VALUE in a or KEY in a for a in argv), argv
        assert "--env-file" not in argv and not any(a.startswith(("-e", "--env")) and "KEY" in a for a in argv)
        got = [argv[i + 1] for i, a in enumerate(argv) if a == "-v" and SS.IN_CONTAINER in argv[i + 1]]
        assert got == [f"/run/bootstrap/sec/{which}:/run/bootstrap/secrets:ro"], argv
        ep = argv.index("--entrypoint")
        assert argv[ep + 1] == "sh" and argv[ep + 3:ep + 5] == ("-c", SS.ENTRY)
        assert list(argv[ep + 6:ep + 6 + len(names)]) == names and argv[ep + 6 + len(names)] == "--"
    assert node[node.index("--") + 1:][:2] == ("ray", "start")
    assert member[member.index("--") + 1] == "python3" and router[router.index("--") + 1] == "vllm-router"


def test_what_a_container_runs_is_read_behind_the_secrets_entrypoint(inv):
    """`docker inspect` of a node container with secrets: Path sh, Args -c ENTRY ... -- ray start ...;
    what bootstrap reads of it (the runtime, Ray's node IP) is the command behind the entry."""
    import json

    from bootstrap.cluster import runtime as RT
    from bootstrap.containers import parse_container_inspect

    argv = PL.container_spec(inv, inv.host("b"), 1024).run_argv()
    i = argv.index("--entrypoint")
    doc = [{"State": {"Status": "running"}, "Config": {}, "Path": argv[i + 1], "Args": list(argv[i + 3:])}]
    st = parse_container_inspect(json.dumps(doc))
    assert st.path == "ray" and st.args[:2] == ("start", "--block") and "--node-ip-address=10.0.0.2" in st.args
    assert RT.of_container(st) == "ray"
    doc[0].update(Path="sh", Args=["-c", "echo", "other", "--", "ray"])  # not ours: as it is
    assert parse_container_inspect(json.dumps(doc)).path == "sh"


def test_without_secrets_a_container_runs_its_own_entrypoint(tmp_path):
    p = tmp_path / "inv.yaml"
    p.write_text(INV.replace("  secrets: [HF_TOKEN, FLEET_KEY]\n", "  secrets: []\n")
                 .replace("  router: {api_key: FLEET_KEY}\n", ""))
    inv = load_inventory(str(p), check_files=False, environ={})
    argv = PL.container_spec(inv, inv.host("a"), 1024).run_argv()
    assert argv[argv.index("--entrypoint") + 1] == "ray" and SS.IN_CONTAINER not in " ".join(argv)
    assert SS.values(inv) == {}


def test_a_spec_with_secrets_is_new_to_a_container_an_older_bootstrap_gave_an_env_file(inv):
    spec = PL.container_spec(inv, inv.host("a"), 1024)
    import hashlib
    import json
    old = hashlib.sha256(json.dumps([spec.name, spec.image, spec.options, spec.entrypoint, spec.command,
                                     spec.secret_names]).encode()).hexdigest()[:16]
    assert spec.spec_hash != old


@pytest.mark.parametrize("root,sudo,fs,refused", [
    (True, False, "tmpfs", None), (False, True, "ramfs", None), (False, False, "tmpfs", "not root"),
    (True, False, "ext2/ext3", "is not a tmpfs"), (True, False, None, None),
])
def test_a_host_that_cannot_keep_secrets_in_memory_is_refused_before_any_change(inv, root, sudo, fs, refused):
    g = FN.GuardFacts(root=root, sudo=sudo, run_fs=fs)
    facts = {h.name: HostFacts(docker_version="27.0", guard=g) for h in inv.hosts}
    got = PR.secret_refusals(inv, facts, inv.hosts)
    if refused is None:
        assert all(v is True for v in got.values())
    else:
        err = got["a"]
        assert refused in str(err) and "cluster.secrets" in str(err) and err.host == "a"


def test_the_guard_facts_read_the_filesystem_of_run():
    out = run(FN.guard_facts_cmd("c")).stdout.decode()
    fs = run(["stat", "-f", "-c", "%T", "/run"]).stdout.decode().strip()
    assert FN.parse_guard(out).run_fs == fs


ALL_ROLES = """
cluster:
  name: sec
  accelerator: none
  secrets: [HF_TOKEN, WANDB_API_KEY, FLEET_KEY, VRRP_PASS]
  replicas: 2
  router: {api_key: FLEET_KEY, vip: {address: 10.0.0.100, secret: VRRP_PASS}}
hosts:
  - {name: a, address: 10.0.0.1, ip: 10.0.0.1}
  - {name: b, address: 10.0.0.2, ip: 10.0.0.2}
"""
ROLE_VALUES = {"HF_TOKEN": VALUE, "WANDB_API_KEY": "wandb-value-1", "FLEET_KEY": KEY, "VRRP_PASS": "vrrp-pw"}


def secrets_of(argv):
    """(the set a container's argv mounts, the names its entry exports); (None, []) without secrets."""
    argv = list(argv)
    dirs = [a.split(":")[0] for a in argv if a.endswith(f":{SS.IN_CONTAINER}:ro")]
    assert len(dirs) <= 1 and "--env-file" not in argv and not any(a.startswith(f"{SS.HOST_ROOT}/") and
                                                                    a not in (f"{d}:{SS.IN_CONTAINER}:ro" for d in dirs)
                                                                    for a in argv)
    if not dirs:
        assert SS.ENTRY not in argv
        return None, []
    i = argv.index(SS.ENTRY)
    return dirs[0].rsplit("/", 1)[1], argv[i + 2:argv.index("--", i)]


def test_each_kind_of_container_holds_exactly_the_secrets_it_uses(tmp_path):
    """The VRRP password reaches keepalived only (not every node container, every Ray task), the API key
    reaches the serve containers and the router as VLLM_API_KEY only (its secret FLEET_KEY no container),
    the workload's secrets the node and serve containers; the mirror and the keeper none. What each
    argv mounts and exports is KINDS' rule, and each set on the host holds exactly its kind's names."""
    from bootstrap.cluster.imagedist import plan as MR
    from bootstrap.fleet import plan as FP

    p = tmp_path / "inv.yaml"
    p.write_text(ALL_ROLES)
    inv = load_inventory(str(p), check_files=False, environ=ROLE_VALUES)
    want = {"node": ["HF_TOKEN", "WANDB_API_KEY"], "serve": ["HF_TOKEN", "WANDB_API_KEY", "VLLM_API_KEY"],
            "standby": ["HF_TOKEN", "WANDB_API_KEY", "VLLM_API_KEY"], "router": ["VLLM_API_KEY"],
            "keepalived": ["VRRP_PASS"], "mirror": [], "keeper": []}
    assert {k: list(SS.kind_names(inv, k)) for k in want} == want
    split = SP.SplitChoice(SP.Parallelism(tp=1, pp=1, world=1), "TP=1", True)
    plan = FP.plan_fleet(inv, FP.Spec("m"), split, nofile={}, ifaces={"a": "eth0", "b": "eth0"})
    member = plan.replicas[0].members[0]
    argvs = {"node": PL.container_spec(FP.replica_inventory(inv, 0), inv.host("a"), 1024).run_argv(),
             "serve": member.create, "standby": member.standby, "router": plan.routers[0].run,
             "keepalived": plan.routers[0].vip_create, "keeper": plan.keeper,
             "mirror": MR.run_argv("nginx:1", "conf")}
    for kind, argv in argvs.items():
        assert secrets_of(argv) == (SS.KINDS[kind][0], want[kind]), kind
        assert not any(v in a for v in ROLE_VALUES.values() for a in argv), kind
    held = {}
    for path in SS.files(inv):
        which, name = path.split("/")
        held.setdefault(which, []).append(name)
    assert held == {"node": want["node"], "serve": want["serve"], "router": want["router"],
                    "vip": want["keepalived"]}
    assert SS.kinds(inv) == ("node", "serve", "standby", "router", "keepalived")


def test_a_single_clusters_node_container_is_where_vllm_runs_and_holds_every_secret(tmp_path):
    p = tmp_path / "inv.yaml"
    p.write_text("cluster: {name: one, accelerator: none, secrets: [HF_TOKEN, VLLM_API_KEY]}\n"
                 "hosts: [{name: a, address: 10.0.0.1}]\n")
    inv = load_inventory(str(p), check_files=False, environ={"HF_TOKEN": VALUE, "VLLM_API_KEY": KEY})
    assert SS.kinds(inv) == ("node+vllm",)
    argv = PL.container_spec(inv, inv.host("a"), 1024).run_argv()
    assert secrets_of(argv) == ("serve", ["HF_TOKEN", "VLLM_API_KEY"])
    assert SS.files(inv) == {"serve/HF_TOKEN": VALUE, "serve/VLLM_API_KEY": KEY}


def test_docs_security_shows_what_each_secret_reaches_generated_from_the_kinds_table():
    from tests.support.checks import docs_page

    hooks, page, built = docs_page("security.md")
    assert page.count(hooks.MARK_SECRETS) == 1
    table = SS.markdown()
    assert table in built and hooks.MARK_SECRETS not in built
    rows = table.splitlines()[2:]
    assert len(rows) == len(SS.KINDS)
    for row, (kind, (which, uses)) in zip(rows, SS.KINDS.items()):
        assert (f"/{which}`" in row) == bool(which) and row.endswith("| none |") == (not uses), (kind, row)
