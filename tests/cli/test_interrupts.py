"""Ctrl-C and SIGTERM, once or repeated, at chosen stages of a real `bootstrap` process: it exits 130
with no traceback, within a bound, and the cluster lock is free afterwards.

The hosts are stand-ins behind a real OpenSSH server on loopback (two ports, two hosts): every
command goes to a ForceCommand script that takes the cluster lock for real (the lock's own shell
script, flock on a file here) and hangs in the first other command each host gets (the facts of
`up`, the first query of `serve`) until its channel closes; later commands fail at once, so the
report after an interrupt is quick. No Docker, nothing but loopback.
"""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from bootstrap.sandbox.sshd import SSHD, free_port, keygen

pytestmark = pytest.mark.skipif(not os.path.exists(SSHD),
                                reason="needs openssh-server (scripts/dev-setup.sh installs it)")

ROOT = Path(__file__).resolve().parents[2]

#: $1: the state directory. The server's port (the last word of SSH_CONNECTION) names the host.
STAND_IN = r"""#!/bin/sh
port=${SSH_CONNECTION##* }
case "$SSH_ORIGINAL_COMMAND" in
  *bootstrap-lock*) : >"$1/lock-$port"; exec sh -c "$SSH_ORIGINAL_COMMAND" ;;
esac
echo "$SSH_ORIGINAL_COMMAND" >>"$1/commands-$port"
if mkdir "$1/hung-$port" 2>/dev/null; then
  # hang until the channel closes: a write then fails (SIGPIPE) and the loop ends
  while echo . 2>/dev/null; do sleep 0.1; done
fi
exit 1
"""


class StandIns:
    def __init__(self, tmp: Path) -> None:
        tmp.mkdir()
        self.dir = tmp
        self.ports = (free_port(), free_port())
        host_key = keygen(tmp / "ssh_host_ed25519_key")
        self.client_key = keygen(tmp / "id_ed25519")
        (tmp / "authorized_keys").write_text((tmp / "id_ed25519.pub").read_text())
        script = tmp / "stand-in.sh"
        script.write_text(STAND_IN)
        script.chmod(0o755)
        pub = (tmp / "ssh_host_ed25519_key.pub").read_text().split()
        (tmp / "known_hosts").write_text("".join(f"[127.0.0.1]:{p} {pub[0]} {pub[1]}\n" for p in self.ports))
        cfg = tmp / "sshd_config"
        cfg.write_text("".join(f"Port {p}\n" for p in self.ports) + f"""ListenAddress 127.0.0.1
HostKey {host_key}
AuthorizedKeysFile {tmp}/authorized_keys
PidFile {tmp}/sshd.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxSessions 20
ForceCommand {script} {tmp}
""")
        Path("/run/sshd").mkdir(exist_ok=True)
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        wait_for(lambda: all(_listening(p) for p in self.ports) or self.proc.poll() is not None, 10, "sshd")
        assert self.proc.poll() is None, "sshd exited"

    def inventory(self, name: str) -> Path:
        hosts = "".join(f"  - {{name: h{i}, address: 127.0.0.1, port: {p}, ip: 10.99.0.{i + 1}, user: root,"
                        f" key: {self.client_key}}}\n" for i, p in enumerate(self.ports))
        path = self.dir / f"{name}.yaml"
        path.write_text(f"cluster:\n  name: {name}\n  accelerator: none\n  image: vllm/vllm-openai:v0.6.0\n"
                        f"  ssh: {{known_hosts: {self.dir}/known_hosts, connect_timeout: 5}}\nhosts:\n{hosts}")
        return path

    def hung(self, *ports: int) -> bool:
        return all((self.dir / f"hung-{p}").is_dir() for p in ports)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _listening(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def wait_for(ok, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(0.05)


@pytest.fixture
def stand_ins(tmp_path):
    """Stand-in hosts of this test's own: commands an earlier test's process sent just before it
    ended may still be running on the last ones."""
    s = StandIns(tmp_path / "stand-ins")
    yield s
    s.stop()


@pytest.fixture
def cluster(stand_ins):
    """A fresh cluster name (so a fresh lock file) and its inventory."""
    name = f"sig-{uuid.uuid4().hex[:8]}"
    yield name, stand_ins.inventory(name), Path(f"/tmp/bootstrap-{name}.lock")
    Path(f"/tmp/bootstrap-{name}.lock").unlink(missing_ok=True)


def popen_cli(*args: str) -> subprocess.Popen:
    """The CLI as a terminal starts it: SIGINT's default handler back even where this test runs
    with it ignored (a background job), so that the child installs its own (see _Interrupts)."""
    before = signal.getsignal(signal.SIGINT)
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        # PYTHONFAULTHANDLER: a process that hangs is sent SIGABRT and prints where each thread is
        return subprocess.Popen([sys.executable, "-m", "bootstrap", *args], cwd=ROOT, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    finally:
        signal.signal(signal.SIGINT, before)


def lock_is_free(path: Path) -> bool:
    """What the next `up` finds: nobody holds the flock (the remote holder is gone with our channel)."""
    with open(path) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


def interrupt(p: subprocess.Popen, signals, gap: float, bound: float = 30.0) -> tuple[str, float]:
    """Send `signals` `gap` seconds apart; stderr and the seconds from the first signal to the exit."""
    t0 = time.monotonic()
    for i, sig in enumerate(signals):
        if i and gap:
            time.sleep(gap)  # the chosen moment in the clean-up, not a wait for a state
        if p.poll() is None:
            p.send_signal(sig)
    try:
        _, err = p.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGABRT)
        try:
            _, err = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        raise AssertionError(f"still running {bound}s after the first signal:\n{err}") from None
    return err, time.monotonic() - t0


INT, TERM = signal.SIGINT, signal.SIGTERM
REPEATS = [
    pytest.param((TERM,), 0.0, id="once"),
    pytest.param((INT, INT), 0.0, id="twice-at-once"),
    pytest.param((TERM, TERM), 0.05, id="twice-in-the-clean-up"),
    pytest.param((INT, TERM, INT), 0.0, id="three-at-once"),
    pytest.param((TERM, INT, TERM), 0.2, id="three-in-the-clean-up"),
]


def interrupt_when(p, ready, what, signals, gap, before=lambda: True):
    """Once `ready()` (within 20 s, the command still running and `before()` true), the signals; the
    command must end in exit 130 with no traceback: (its stderr, the seconds it took to exit)."""
    try:
        wait_for(lambda: ready() or p.poll() is not None, 20, what)
        assert p.poll() is None, p.communicate()[1]
        assert before()
        err, seconds = interrupt(p, signals, gap)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert "Traceback" not in err and "RuntimeError" not in err, err
    return err, seconds


@pytest.mark.parametrize("signals, gap", REPEATS)
def test_up_interrupted_in_the_facts_stage_exits_130_with_the_lock_released(cluster, stand_ins, signals, gap):
    name, inv, lock = cluster
    p = popen_cli("up", "-i", str(inv))
    err, seconds = interrupt_when(p, lambda: stand_ins.hung(*stand_ins.ports), "both hosts in facts", signals, gap,
                                  before=lambda: not lock_is_free(lock))  # held by this `up`
    assert seconds < 30, err
    if len(signals) < 3:  # the third exits at once: no report
        assert "interrupted during facts" in err, err
    wait_for(lambda: lock_is_free(lock), 10, "the cluster lock released")


@pytest.mark.parametrize("signals, gap", REPEATS[1:4])
def test_up_interrupted_while_waiting_for_the_lock_leaves_no_waiter_behind(cluster, stand_ins, signals, gap):
    name, inv, lock = cluster
    for p in stand_ins.ports:  # every command but the lock's fails at once (the report after the interrupt)
        (stand_ins.dir / f"hung-{p}").mkdir()
    lock.write_text("another run\n")
    with open(lock) as theirs:
        fcntl.flock(theirs, fcntl.LOCK_EX)
        p = popen_cli("up", "-i", str(inv), "--lock-wait", "60")
        asked = stand_ins.dir / f"lock-{stand_ins.ports[0]}"
        interrupt_when(p, asked.exists, "up asking for the lock", signals, gap)
    # ours released: a waiter left behind by the interrupted `up` would take it now
    wait_for(lambda: lock_is_free(lock), 10, "the cluster lock free after the other run's release")


@pytest.mark.parametrize("signals, gap", REPEATS[1:3] + REPEATS[4:])
def test_serve_interrupted_in_its_first_query_exits_130(cluster, stand_ins, signals, gap, tmp_path):
    name, inv, lock = cluster
    p = popen_cli("serve", "-i", str(inv), "facebook/opt-125m")
    err, seconds = interrupt_when(p, lambda: stand_ins.hung(stand_ins.ports[0]), "the head's first query", signals, gap)
    assert seconds < 30, err
