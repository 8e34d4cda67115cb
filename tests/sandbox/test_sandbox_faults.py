"""Fault injection on the sandbox: real sshd, dockerd, registry and Ray, one fault at a time.

Every test starts from a torn-down cluster (or says what it starts from), injects one fault from
outside the tool, runs the CLI as a user would, and checks the hosts from outside the tool.
"""
import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.sandbox import (
    CONTAINER,
    ROOT,
    cli,
    container_id,
    on_node,
    ray_alive_ids,
    ray_alive_ips,
    write_inventory,
)

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def cluster(sandbox3):
    inv = str(sandbox3.inventory)
    cli("down", "--yes", "-i", inv)
    yield sandbox3
    for n in sandbox3.nodes:
        subprocess.run(["docker", "unpause", n.container], capture_output=True)
    cli("down", "--yes", "-i", inv)


@pytest.fixture
def clean(cluster):
    """Each test starts with no cluster container on any node."""
    r = cli("down", "--yes", "-i", str(cluster.inventory))
    assert r.returncode == 0, r.stderr
    return cluster


@contextlib.contextmanager
def paused(node):
    """The node freezes: TCP still answers (kernel), sshd never does, like a hung host."""
    subprocess.run(["docker", "pause", node.container], check=True)
    try:
        yield
    finally:
        subprocess.run(["docker", "unpause", node.container], check=True)


@contextlib.contextmanager
def cut_off(node):
    """The node's network drops our SSH packets: no answer at all (not even a refusal)."""
    on_node(node, "iptables", "-I", "INPUT", "-p", "tcp", "--dport", "22", "-j", "DROP")
    try:
        yield
    finally:
        on_node(node, "iptables", "-D", "INPUT", "-p", "tcp", "--dport", "22", "-j", "DROP")


FAULTS = {"frozen": paused, "cut": cut_off}


def new_key(path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def ips(cluster, *nodes):
    return sorted(n.ip for n in nodes)


def sh(node, script, check=True):
    return on_node(node, "sh", "-c", script, check=check)


STOP_DOCKERD = ('p=$(cat /var/run/docker.pid 2>/dev/null); [ -n "$p" ] && kill "$p"; '
                'for i in $(seq 120); do [ -n "$p" ] && [ -d /proc/$p ] || exit 0; sleep 0.5; done; exit 1')


def start_dockerd(node, args=""):
    sh(node, f'rm -f /var/run/docker.pid; (dockerd {args} >/var/log/dockerd.log 2>&1 &); '
             'for i in $(seq 120); do docker version >/dev/null 2>&1 && exit 0; sleep 0.5; done; '
             'tail -5 /var/log/dockerd.log; exit 1')


# -- a node unreachable at `up` -------------------------------------------------------------------
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_unreachable_node_fails_fast_then_allow_partial_then_heals(clean, fault):
    n1, n2, n3 = clean.nodes
    inv = str(clean.inventory)
    timeout = yaml.safe_load(Path(inv).read_text())["cluster"]["ssh"]["connect_timeout"]
    with FAULTS[fault](n3):
        r = cli("up", "--yes", "-i", inv)
        assert r.returncode == 3, r.stderr
        assert n3.name in r.stderr and "cannot connect" in r.stderr and "Traceback" not in r.stderr
        assert r.seconds < timeout + 10, f"took {r.seconds:.1f}s with connect_timeout {timeout}"
        # all or nothing: the reachable nodes were left as they were
        assert [container_id(n) for n in (n1, n2)] == [None, None]

        p = cli("up", "--yes", "-i", inv, "--allow-partial")
        assert p.returncode == 0, p.stderr
        assert f"{n3.name} left out (--allow-partial)" in p.stderr
        assert ray_alive_ips(n1) == ips(clean, n1, n2)  # fully started, not half
        kept = [container_id(n) for n in (n1, n2)]
        assert None not in kept
    h = cli("up", "--yes", "-i", inv, "--json")
    assert h.returncode == 0, h.stderr
    assert ray_alive_ips(n1) == ips(clean, n1, n2, n3)
    assert [container_id(n) for n in (n1, n2)] == kept  # only the missing node was started


def test_allow_partial_never_skips_the_head(clean):
    n1 = clean.nodes[0]
    with paused(n1):
        r = cli("up", "--yes", "-i", str(clean.inventory), "--allow-partial")
    assert r.returncode == 3 and n1.name in r.stderr, r.stderr
    assert all(container_id(n) is None for n in clean.nodes[1:])


# -- node-level faults: each a one-line error naming the host and the fix ------------------------
def test_docker_daemon_stopped_on_one_node(clean):
    n1, n2, n3 = clean.nodes
    sh(n2, STOP_DOCKERD)
    try:
        r = cli("up", "--yes", "-i", str(clean.inventory))
    finally:
        start_dockerd(n2)
    assert r.returncode == 3, r.stderr
    assert n2.name in r.stderr and "docker" in r.stderr.lower() and "Traceback" not in r.stderr
    assert container_id(n1) is None and container_id(n3) is None  # nothing changed anywhere


def test_full_disk_on_one_node_names_it_and_the_fix(clean):
    n1, n2, n3 = clean.nodes
    # node3's Docker on a 300 MB tmpfs: the image (4 GB) cannot be pulled there
    sh(n3, STOP_DOCKERD)
    sh(n3, "mkdir -p /mnt/small && mount -t tmpfs -o size=300m tmpfs /mnt/small")
    try:
        start_dockerd(n3, "--data-root /mnt/small")
        r = cli("up", "--yes", "-i", str(clean.inventory), "--timeout", "60")
    finally:
        sh(n3, STOP_DOCKERD, check=False)
        sh(n3, "umount /mnt/small", check=False)
        start_dockerd(n3)
    assert r.returncode == 1, r.stderr
    assert n3.name in r.stderr and "disk is full" in r.stderr and "Traceback" not in r.stderr
    assert all(container_id(n) is None for n in clean.nodes)  # the pull comes before any change


def test_wrong_ssh_key(clean, tmp_path):
    key = new_key(tmp_path / "other_key")
    inv = write_inventory(clean.inventory, tmp_path / "inv.yaml",
                          lambda d: d["cluster"]["ssh"].update(key=str(key)))
    r = cli("up", "--yes", "-i", inv)
    assert r.returncode == 3, r.stderr
    assert "authentication failed" in r.stderr and "check the user and key" in r.stderr
    assert all(n.name in r.stderr for n in clean.nodes)
    assert all(container_id(n) is None for n in clean.nodes)


def test_unknown_and_changed_host_keys(clean, tmp_path):
    kh_path = Path(yaml.safe_load(Path(clean.inventory).read_text())["cluster"]["ssh"]["known_hosts"])
    lines = kh_path.read_text().splitlines()
    n2 = clean.nodes[1]
    # unknown: node2's key missing from known_hosts
    unknown = tmp_path / "unknown_kh"
    unknown.write_text("\n".join(ln for ln in lines if n2.ip not in ln.split()[0]) + "\n")
    inv = write_inventory(clean.inventory, tmp_path / "u.yaml",
                          lambda d: d["cluster"]["ssh"].update(known_hosts=str(unknown)))
    r = cli("up", "--yes", "-i", inv)
    assert r.returncode == 3 and n2.name in r.stderr and "not in known_hosts" in r.stderr, r.stderr
    assert "--accept-new-host-keys" in r.stderr
    # changed: node2's entry carries another key
    other = new_key(tmp_path / "k")
    kind, b64 = Path(str(other) + ".pub").read_text().split()[:2]
    changed = tmp_path / "changed_kh"
    changed.write_text("\n".join(ln if n2.ip not in ln.split()[0] else f"{ln.split()[0]} {kind} {b64}"
                                 for ln in lines) + "\n")
    inv = write_inventory(clean.inventory, tmp_path / "c.yaml",
                          lambda d: d["cluster"]["ssh"].update(known_hosts=str(changed)))
    r = cli("up", "--yes", "-i", inv, "--accept-new-host-keys")  # even with accept-new
    assert r.returncode == 3 and n2.name in r.stderr and "CHANGED" in r.stderr, r.stderr
    assert all(container_id(n) is None for n in clean.nodes)


# -- containers killed after `up` ---------------------------------------------------------------
def test_killed_worker_shows_in_status_and_up_restarts_only_it(clean):
    n1, n2, n3 = clean.nodes
    inv = str(clean.inventory)
    assert cli("up", "--yes", "-i", inv).returncode == 0
    before = [container_id(n) for n in clean.nodes]
    old_id = ray_alive_ids(n1)[n3.ip]
    on_node(n3, "docker", "kill", CONTAINER)
    t = time.monotonic()
    s = cli("status", "-i", inv)
    assert s.returncode == 1, s.stdout
    row = next(ln for ln in s.stdout.splitlines() if n3.name in ln)
    assert "exited" in row, s.stdout
    print(f"status showed the killed worker {time.monotonic() - t:.1f}s after the kill")
    assert time.monotonic() - t < 15
    r = cli("up", "--yes", "-i", inv, "--json")
    assert r.returncode == 0, r.stderr
    after = [container_id(n) for n in clean.nodes]
    assert after[:2] == before[:2] and after[2] != before[2]
    # rejoined: when `up` returns, Ray lists a NEW registration for node3, not just the dead one
    # it keeps listing as alive until its heartbeats time out
    now = ray_alive_ids(n1)
    assert set(now[n3.ip]) - set(old_id), (old_id, now)
    assert ray_alive_ips(n1) == ips(clean, n1, n2, n3)


def test_killed_head_is_restarted_and_every_worker_rejoins(clean):
    n1, n2, n3 = clean.nodes
    inv = str(clean.inventory)
    assert cli("up", "--yes", "-i", inv).returncode == 0
    before = [container_id(n) for n in clean.nodes]
    on_node(n1, "docker", "kill", CONTAINER)
    r = cli("up", "--yes", "-i", inv)
    assert r.returncode == 0, r.stderr
    after = [container_id(n) for n in clean.nodes]
    assert all(a != b for a, b in zip(after, before))  # the workers were joined to the old GCS
    assert ray_alive_ips(n1) == ips(clean, n1, n2, n3)


# -- Ctrl-C / SIGTERM ---------------------------------------------------------------------------
def popen_cli(*args):
    """The CLI as a user's terminal starts it: Ctrl-C delivered. A process started in the background
    by a non-interactive shell (`bash -c 'pytest ... &'`, some CI runners) inherits SIGINT ignored,
    and an ignored signal stays ignored across exec: Python then installs no KeyboardInterrupt
    handler and the CLI (like any POSIX program) honours the ignore. So the child gets SIGINT's
    default back here; the handler is ours only for the instant of the fork."""
    before = signal.getsignal(signal.SIGINT)
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen([sys.executable, "-m", "bootstrap", *args], cwd=ROOT, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    finally:
        signal.signal(signal.SIGINT, before)


def read_until(proc, needle, timeout):
    """stderr lines of a running CLI until one contains ``needle``."""
    seen = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if needle(line):
            return seen
    raise AssertionError(f"no matching line within {timeout}s:\n{''.join(seen)}")


def head_procs(head):
    r = on_node(head, "docker", "exec", CONTAINER, "sh", "-c",
                "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done", check=False)
    return r.stdout


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_interrupt_during_up_reports_each_host_and_a_rerun_continues(clean, sig):
    n1, n2, n3 = clean.nodes
    inv = str(clean.inventory)
    p = popen_cli("up", "--yes", "-i", inv)
    try:
        # right away: into the wait for the head's GCS (about a second on the sandbox: `ray start
        # --head` is still starting Python), before any worker
        seen = read_until(p, lambda ln: "head-gcs" in ln and " start" in ln, 180)
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    err = "".join(seen) + err
    print(err)
    assert p.returncode == 130, err
    assert "interrupted during head-gcs" in err and "Traceback" not in err
    lines = {n.name: next(ln for ln in err.splitlines() if ln.strip().startswith(n.name + " ")) for n in clean.nodes}
    assert "done: container running" in lines[n1.name]
    assert "not started: no container" in lines[n2.name] and "not started" in lines[n3.name]
    # remote work stopped: no Ray poller left in the head container, no worker half-started
    assert "bootstrap-ray-wait" not in head_procs(n1)
    assert container_id(n2) is None and container_id(n3) is None
    head = container_id(n1)
    r = cli("up", "--yes", "-i", inv)
    assert r.returncode == 0, r.stderr
    assert container_id(n1) == head  # continued from there: the head was kept
    assert ray_alive_ips(n1) == ips(clean, n1, n2, n3)


# -- two runs at once ---------------------------------------------------------------------------
def test_concurrent_up_is_refused_and_down_queues_behind_it(clean):
    inv = str(clean.inventory)
    a = popen_cli("up", "--yes", "-i", inv)
    try:
        a_seen = read_until(a, lambda ln: " lock " in ln and " done" in ln, 120)
        b = cli("up", "--yes", "-i", inv)
        if b.returncode != 5:
            a.terminate()
            a_err = "".join(a_seen) + a.communicate(timeout=60)[1]
            raise AssertionError(f"the second up was not refused:\n{b.stderr}\n-- the first up:\n{a_err}")
        assert "held by" in b.stderr and "`bootstrap up`" in b.stderr and "--lock-timeout" in b.stderr
        assert len([ln for ln in b.stderr.splitlines() if ln.startswith("error:")]) == 1
        c = popen_cli("down", "--yes", "-i", inv, "--lock-timeout", "300")
        a_out, a_err = a.communicate(timeout=300)
        t_a = time.monotonic()
        c_out, c_err = c.communicate(timeout=300)
    finally:
        for p in (a,):
            if p.poll() is None:
                p.kill()
    assert a.returncode == 0, a_err
    assert "Ray cluster ready: 3 node(s)" in a_out  # up was not disturbed by the queued down
    assert c.returncode == 0, c_err
    assert "waiting" in c_err and "`bootstrap up`" in c_err  # it saw who held the lock
    assert "removed the container on 3 host(s)" in c_out  # and ran after up finished, on all 3
    assert all(container_id(n) is None for n in clean.nodes)
    print(f"down finished {time.monotonic() - t_a:.1f}s after up")
