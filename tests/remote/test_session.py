"""Session.abandon: the interrupt path closes the connections within a bound, whatever state an
interrupted paramiko call left them in."""
import threading
import time

from bootstrap.remote.session import Session
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
    assert time.monotonic() - t < 0.1
    never.set()


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
