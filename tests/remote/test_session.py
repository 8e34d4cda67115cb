"""Session.abandon: the interrupt path closes the connections within a bound, whatever state an
interrupted paramiko call left them in. Session.cleanup: a clean-up on an error path."""
import signal
import threading
import time

import pytest

from bootstrap.errors import CommandFailed, ServeFailed, notes_of
from bootstrap.remote.fanout import fan_out
from bootstrap.remote.session import Session
from tests.support.fake_hosts import DOCKER_DOWN, FakeHost, fake_session
from tests.support.fleet_inventories import hosts_yaml, load


def test_abandon_gives_up_on_a_close_that_hangs_and_later_closes_do_nothing(tmp_path):
    inv = load(tmp_path, "cluster:\n  accelerator: none\n" + hosts_yaml(2))
    sess = Session(inv)
    never = threading.Event()
    closed = []
    wedged, fine = sess.ssh.values()
    wedged.close = lambda: never.wait(30)  # a transport whose lock an interrupt left held
    fine.close = lambda: closed.append("h1")
    t = time.monotonic()
    sess.abandon(within=0.3)
    assert 0.25 < time.monotonic() - t < 5
    t = time.monotonic()
    sess.close()  # what `with Session(...)` does on the way out: must not wait on the wedged one again
    assert time.monotonic() - t < 5  # waiting on it again would take its 30 s
    never.set()


def test_a_fan_out_stops_on_a_signal_another_thread_received_and_its_threads_do_not_hold_the_exit():
    """The kernel hands a process's signal to any of its threads; Python runs the handler (here:
    KeyboardInterrupt) in the main thread only when that thread next runs. A wait without a timeout
    (ThreadPoolExecutor's as_completed) was then woken only by the hung work's own end."""
    release, started = threading.Event(), threading.Event()
    workers: list[threading.Thread] = []

    def fn(i: int) -> None:
        workers.append(threading.current_thread())
        started.set()
        release.wait(30)  # a host that does not answer

    def shoot() -> None:
        started.wait(10)
        time.sleep(0.3)  # the moment: the main thread waiting on the fan-out (not a wait for a state)
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)  # delivered to this thread, not main

    def interrupt(signum, frame):  # noqa: ANN001 - what the CLI's handler does with SIGINT/SIGTERM
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGUSR1, interrupt)
    try:
        threading.Thread(target=shoot, daemon=True).start()
        t = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            fan_out(range(2), fn, key=str, parallel=2)
        assert time.monotonic() - t < 5  # not the 30 s of the hung work
        assert len(workers) == 2 and all(w.daemon for w in workers)  # the interpreter's exit does not join them
    finally:
        release.set()
        signal.signal(signal.SIGUSR1, before)


def test_close_closes_every_connection_even_when_releasing_the_lock_fails(tmp_path):
    inv = load(tmp_path, "cluster:\n  accelerator: none\n" + hosts_yaml(2))
    sess = Session(inv)
    closed = []
    for name, s in sess.ssh.items():
        s.close = lambda name=name: closed.append(name)

    class Broken:
        def release(self) -> None:
            raise OSError("the transport went away")

    sess._lock = Broken()
    with pytest.raises(OSError):
        sess.close()
    assert sorted(closed) == ["h0", "h1"] and sess._lock is None  # closing the head's releases the lock


def test_leaving_a_session_on_an_interrupt_abandons_it(tmp_path):
    """`with Session(...)` left by Ctrl-C / SIGTERM: the bounded close (abandon), not close(), which
    waits on a transport an interrupted paramiko call left locked."""
    inv = load(tmp_path, "cluster:\n  accelerator: none\n" + hosts_yaml(2))
    calls = []
    with pytest.raises(KeyboardInterrupt):
        with Session(inv) as sess:
            sess.abandon = lambda: calls.append("abandon")
            sess.close = lambda: calls.append("close")
            raise KeyboardInterrupt
    assert calls == ["abandon"] and sess.cancel.is_set()


def test_abandon_closes_every_connection_when_nothing_hangs(tmp_path):
    inv = load(tmp_path, "cluster:\n  accelerator: none\n" + hosts_yaml(2))
    sess = Session(inv)
    closed = []
    for name, s in sess.ssh.items():
        s.close = lambda name=name: closed.append(name)
    t = time.monotonic()
    sess.abandon()
    assert time.monotonic() - t < 1 and sorted(closed) == ["h0", "h1"]
    sess.close()
    assert sorted(closed) == ["h0", "h1"]  # not closed twice


def test_cleanup_on_an_error_path_attaches_each_failure_and_replaces_nothing(tmp_path):
    """serve's and the fleet's clean-up after vLLM did not serve: a host where it fails is said under
    the error (a note), and the error itself stays the one raised."""
    inv = load(tmp_path, "cluster:\n  accelerator: none\n" + hosts_yaml(2))
    sess = fake_session(inv, {"h0": FakeHost("h0", [("docker", (0, "", ""))]),
                              "h1": FakeHost("h1", [("docker", DOCKER_DOWN)])})
    failed = ServeFailed("vLLM exited after 12s: CUDA out of memory")

    def stop(h):
        return sess.ssh[h.name].run(("docker", "rm", "-f", "x"))
    sess.cleanup("stop-failed", inv.hosts, stop, failed)
    notes = notes_of(failed)
    assert len(notes) == 1 and notes[0].startswith("stop-failed: h1: `docker rm -f x` failed (exit 1)")
    assert "Cannot connect to the Docker daemon" in notes[0]
    with pytest.raises(CommandFailed):  # the same step outside a clean-up is an error of its own
        stop(inv.host("h1"))
