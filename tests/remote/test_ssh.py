"""The SSH transport against a real OpenSSH server on loopback."""
import hashlib
import os
import stat
import time
from pathlib import Path

import pytest

from bootstrap.errors import CommandFailed, ConnectionLost, HostUnreachable
from bootstrap.model import Host, SSHSettings, SSHTarget
from bootstrap.remote.ssh import LockBusy, SSHHost
from bootstrap.sandbox.sshd import SSHD, keygen, start_sshd

pytestmark = pytest.mark.skipif(not os.path.exists(SSHD),
                                reason="needs openssh-server (scripts/dev-setup.sh installs it)")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    d = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield d
    d.stop()


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    # ~/.ssh/known_hosts of the person running the tests must not decide the outcome.
    monkeypatch.setattr("bootstrap.remote.ssh.KNOWN_HOSTS", str(tmp_path / "home_known_hosts"))


def make(sshd, known_hosts=None, **settings):
    host = Host("loop", SSHTarget("127.0.0.1", user="root", port=sshd.port, key=str(sshd.client_key)),
                ip="127.0.0.1", role="head")
    return SSHHost(host, SSHSettings(known_hosts=str(known_hosts) if known_hosts else None,
                                     connect_timeout=5, command_timeout=30, **settings), sleep=lambda s: None)


def known(tmp_path, sshd):
    kh = tmp_path / "known_hosts"
    kh.write_text(sshd.known_hosts_line())
    return kh


def test_unknown_host_key_is_refused_by_default(sshd, tmp_path):
    with pytest.raises(HostUnreachable, match="not in known_hosts"):
        make(sshd, tmp_path / "empty_known_hosts").connect()


def test_changed_host_key_is_refused_even_with_accept_new(sshd, tmp_path):
    other = keygen(tmp_path / "other")
    pub = Path(str(other) + ".pub").read_text().split()
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{sshd.port} {pub[0]} {pub[1]}\n")
    with pytest.raises(HostUnreachable, match="CHANGED"):
        make(sshd, kh, accept_new_host_keys=True).connect()


def test_accept_new_records_the_key_then_verifies_it(sshd, tmp_path):
    kh = tmp_path / "kh"
    s = make(sshd, kh, accept_new_host_keys=True)
    assert s.connect().run(["true"]).ok
    s.close()
    recorded = kh.read_text().split()
    assert recorded[0] == f"[127.0.0.1]:{sshd.port}"
    assert recorded[2] == Path(str(sshd.host_key) + ".pub").read_text().split()[1]
    s2 = make(sshd, kh)  # verification on, key now known
    assert s2.connect().run(["true"]).ok
    s2.close()


def test_argv_reaches_the_remote_side_unchanged(sshd, tmp_path):
    s = make(sshd, known(tmp_path, sshd))
    marker = tmp_path / "pwned"
    evil = [f"$(touch {marker})", f"`touch {marker}`", "a b", "it's", '"q"', "; touch " + str(marker), "*"]
    r = s.run(["printf", "%s\\n", *evil])
    assert r.stdout.splitlines() == evil
    assert not marker.exists()
    s.close()


def test_failure_carries_host_command_and_output(sshd, tmp_path):
    s = make(sshd, known(tmp_path, sshd))
    with pytest.raises(CommandFailed) as ei:
        s.run(["sh", "-c", "echo boom >&2; exit 7"])
    assert ei.value.host == "loop" and ei.value.exit_code == 7 and "boom" in str(ei.value)
    s.close()


def test_command_timeout(sshd, tmp_path):
    s = make(sshd, known(tmp_path, sshd))
    t = time.monotonic()
    with pytest.raises(CommandFailed, match="timed out"):
        s.run(["sleep", "30"], timeout=1)
    assert time.monotonic() - t < 10
    s.close()


def test_stream_stdin_and_secrets_written_over_stdin(sshd, tmp_path):
    """A 5 MiB stream arrives whole; the secrets' writer (secretstore.write_argv) gets the values on
    stdin over a real SSH session, and its failure shows what the caller displays, not the script."""
    from bootstrap.cluster.guard import secretstore as SS

    s = make(sshd, known(tmp_path, sshd))
    blob = os.urandom(5 << 20)
    r = s.run_with_input(["sha256sum"], [blob[i:i + 65536] for i in range(0, len(blob), 65536)])
    assert r.stdout.split()[0] == hashlib.sha256(blob).hexdigest()
    root = Path("/dev/shm") / f"bootstrap-ssh-{os.getpid()}"
    try:
        s.run_with_input(SS.write_argv("c", prune=True, root=str(root)),
                         [SS.write_body({"serve/HF_TOKEN": "hf_secret"})], display="write HF_TOKEN")
        assert (root / "c" / "serve" / "HF_TOKEN").read_text() == "hf_secret"
        assert stat.S_IMODE((root / "c" / "serve" / "HF_TOKEN").stat().st_mode) == 0o400
    finally:
        s.run(SS.remove_argv("c", root=str(root)))
    assert not root.exists()
    with pytest.raises(CommandFailed) as ei:  # on disk: refused, named as the caller displays it
        s.run_with_input(SS.write_argv("c", prune=True, root=str(tmp_path / "b")), [b"serve/HF_TOKEN=hf_secret\n"],
                         display="write HF_TOKEN")
    assert "`write HF_TOKEN` failed (exit 3)" in str(ei.value) and "hf_secret" not in str(ei.value)
    assert not (tmp_path / "b").exists()
    s.close()


def test_unreachable_port_fails_after_retries(tmp_path, sshd):
    from bootstrap.sandbox.sshd import free_port
    host = Host("gone", SSHTarget("127.0.0.1", user="root", port=free_port(), key=str(sshd.client_key)),
                ip="127.0.0.1", role="head")
    sleeps = []
    s = SSHHost(host, SSHSettings(connect_timeout=2, connect_retries=2), sleep=sleeps.append)
    with pytest.raises(HostUnreachable, match="3 attempts"):
        s.connect()
    assert sleeps == [0.5, 1.0]  # backoff between attempts


def test_stream_out_pipes_one_command_into_another(sshd, tmp_path):
    s = make(sshd, known(tmp_path, sshd))
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(3 << 20))
    (src / "dir with space").mkdir()
    (src / "dir with space" / "b.txt").write_text("hello")
    dst = tmp_path / "dst"
    s.run_with_input(["sh", "-c", 'mkdir -p "$1" && tar -C "$1" -xf -', "sh", str(dst)],
                     s.stream_out(["tar", "-C", str(src), "-cf", "-", "."]))
    assert (dst / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
    assert (dst / "dir with space" / "b.txt").read_text() == "hello"
    with pytest.raises(CommandFailed):
        list(s.stream_out(["sh", "-c", "echo partial; exit 3"]))
    s.close()


# -- the cluster lock and hang-up of long commands ----------------------------------------------
def test_lock_is_exclusive_names_the_holder_and_is_released(sshd, tmp_path):
    kh = known(tmp_path, sshd)
    path = str(tmp_path / "cluster.lock")
    a, b = make(sshd, kh), make(sshd, kh)
    held = a.acquire_lock(path, "alice@ctl pid 1 `bootstrap up`")
    try:
        with pytest.raises(LockBusy, match=r"held by alice@ctl pid 1 `bootstrap up`") as ei:
            b.acquire_lock(path, "bob@ctl pid 2 `bootstrap down`")
        assert ei.value.exit_status == 5
    finally:
        held.release()
    # released: the next taker gets it at once
    t = time.monotonic()
    b.acquire_lock(path, "bob@ctl pid 2", wait=10).release()
    assert time.monotonic() - t < 5


def test_lock_waits_for_the_holder_when_asked(sshd, tmp_path):
    import threading

    kh = known(tmp_path, sshd)
    path = str(tmp_path / "cluster.lock")
    a, b = make(sshd, kh), make(sshd, kh)
    held = a.acquire_lock(path, "first")
    seen = []
    threading.Timer(1.5, held.release).start()
    t = time.monotonic()
    b.acquire_lock(path, "second", wait=20, on_wait=seen.append).release()
    waited = time.monotonic() - t
    assert seen == ["first"]
    assert 1.0 < waited < 15


def test_lock_is_released_when_the_holder_connection_dies(sshd, tmp_path):
    kh = known(tmp_path, sshd)
    path = str(tmp_path / "cluster.lock")
    a, b = make(sshd, kh), make(sshd, kh)
    a.acquire_lock(path, "crashed run")
    a.conn.transport.sock.close()  # like a killed process: no release(), the socket just goes
    b.acquire_lock(path, "next", wait=10).release()


def test_a_dropped_connection_takes_its_lock_again_before_the_next_command(sshd, tmp_path):
    kh = known(tmp_path, sshd)
    path = str(tmp_path / "cluster.lock")
    a, b = make(sshd, kh), make(sshd, kh)
    held = a.acquire_lock(path, "first run")
    a.conn.transport.sock.close()  # sshd restarted, a network blip: the lock's channel goes with it
    assert a.run(("echo", "hi"), query=True).stdout == "hi\n"  # reconnected: the lock first
    with pytest.raises(LockBusy, match="held by first run"):
        b.acquire_lock(path, "second run")
    held.release()
    b.acquire_lock(path, "second run", wait=10).release()


def test_a_lock_another_run_took_while_the_connection_was_down_stops_the_next_command(sshd, tmp_path, monkeypatch):
    from bootstrap.errors import LockLost
    from bootstrap.remote import ssh as S

    monkeypatch.setattr(S, "RETAKE_WAIT", 1.0)
    kh = known(tmp_path, sshd)
    path = str(tmp_path / "cluster.lock")
    a, b = make(sshd, kh), make(sshd, kh)
    a.acquire_lock(path, "first run")
    a.conn.transport.sock.close()
    theirs = b.acquire_lock(path, "second run", wait=10)
    try:
        with pytest.raises(LockLost, match="dropped and second run took the lock meanwhile") as ei:
            a.run(("echo", "hi"), query=True)
        assert ei.value.exit_status == 5
        with pytest.raises(LockBusy):  # still theirs
            make(sshd, kh).acquire_lock(path, "third run")
    finally:
        theirs.release()


def test_hangup_terminates_the_remote_command_when_the_channel_closes(sshd, tmp_path):
    import threading

    kh = known(tmp_path, sshd)
    marker = tmp_path / "still-running"
    s = make(sshd, kh)
    script = f"trap 'exit 143' TERM; for i in $(seq 100); do sleep 0.1; done; touch {marker}"
    err = []

    def run():
        try:
            s.run(("sh", "-c", script), hangup=True, timeout=30)
        except Exception as exc:  # noqa: BLE001 - the connection is closed under it
            err.append(exc)

    th = threading.Thread(target=run)
    th.start()
    time.sleep(1.0)
    s.close()  # what an interrupted `up` does
    th.join(10)
    time.sleep(11)  # the command would have finished after 10 s
    assert not marker.exists()
    assert err


def test_hangup_keeps_exit_code_and_output(sshd, tmp_path):
    s = make(sshd, known(tmp_path, sshd))
    r = s.run(("sh", "-c", "echo out; echo err >&2; exit 7"), hangup=True, check=False, timeout=20)
    assert (r.exit_code, r.stdout, r.stderr) == (7, "out\n", "err\n")
    assert s.run(("echo", "$(touch /tmp/pwned-hangup)"), hangup=True).stdout == "$(touch /tmp/pwned-hangup)\n"
    assert not Path("/tmp/pwned-hangup").exists()


def test_unreachable_host_fails_within_the_connect_timeout_without_retrying(tmp_path):
    # TEST-NET-1 is never routed: a timeout must not be retried (connect_retries only covers
    # refused/reset), so the whole failure costs one connect_timeout.
    host = Host("gone", SSHTarget("192.0.2.1", user="root", port=22), ip="192.0.2.1", role="head")
    s = SSHHost(host, SSHSettings(connect_timeout=2, connect_retries=3))
    t = time.monotonic()
    with pytest.raises(HostUnreachable, match="gone"):
        s.connect()
    assert time.monotonic() - t < 2 * 2


def test_refused_connection_is_retried(tmp_path):
    import socket as so

    sock = so.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens: connection refused
    slept = []
    host = Host("down", SSHTarget("127.0.0.1", user="root", port=port), ip="127.0.0.1", role="head")
    s = SSHHost(host, SSHSettings(connect_timeout=2, connect_retries=2), sleep=slept.append)
    with pytest.raises(HostUnreachable, match=r"3 attempts"):
        s.connect()
    assert slept == [0.5, 1.0]


def _drops_its_connection_once(flag):
    """A command that kills the sshd process serving its connection the first time it runs."""
    return ("sh", "-c", f"if [ -e {flag} ]; then echo second; else touch {flag}; kill -9 $PPID; sleep 5; fi")


def test_a_query_is_asked_again_on_a_new_connection_when_the_server_drops_it(sshd, tmp_path):
    s = make(sshd, known(tmp_path, sshd))
    first = s.conn
    r = s.run(_drops_its_connection_once(tmp_path / "dropped"), query=True, timeout=20)
    assert r.stdout == "second\n" and (tmp_path / "dropped").exists()
    assert s.conn is not first


def test_a_command_that_changes_things_is_not_run_twice_when_the_server_drops_it(sshd, tmp_path):
    s = make(sshd, known(tmp_path, sshd))
    with pytest.raises(ConnectionLost, match="connection lost while running"):
        s.run(_drops_its_connection_once(tmp_path / "dropped"), timeout=20)
    assert s.run(("echo", "again")).stdout == "again\n"  # the next command connects again


def test_close_after_an_interrupt_never_raises_and_forgets_the_connection(sshd, tmp_path):
    """After Ctrl-C, the session closes every connection from a second thread while the command in
    flight is failing in its own; paramiko's Transport.close then raised AttributeError ('NoneType'
    object has no attribute '_unlink_channel'), printed as a thread traceback to the user (seen in
    the interrupt test). Closing is best effort: the transport is torn down, the error swallowed."""
    s = make(sshd, known(tmp_path, sshd))
    s.connect()
    conn = s._conn
    real = conn.close

    def racing_close():
        real()
        raise AttributeError("'NoneType' object has no attribute '_unlink_channel'")
    conn.close = racing_close
    s.close()
    assert s._conn is None and not conn.is_connected
    s.close()  # again: nothing left to close


@pytest.mark.parametrize("jump, parts", [
    ("[2001:db8::7]:2", (None, "2001:db8::7", 2)), ("ops@[2001:db8::7]:2200", ("ops", "2001:db8::7", 2200)),
    ("[2001:db8::7]", (None, "2001:db8::7", None)), ("2001:db8::7", (None, "2001:db8::7", None)),
    ("ops@bastion.example.com:2200", ("ops", "bastion.example.com", 2200)), ("bastion", (None, "bastion", None)),
])
def test_a_jump_host_is_read_as_the_inventory_writes_it_ipv6_in_brackets_too(jump, parts):
    from bootstrap.remote.ssh import _jump_parts

    assert _jump_parts(jump) == parts
