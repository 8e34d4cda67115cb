"""Run functions on daemon threads and wait for them in short steps (pure: threads, no I/O of its own).

Not a ThreadPoolExecutor: its threads are joined when the interpreter exits (and by
shutdown(wait=True)), so a thread blocked on a host that never answers kept an interrupted `up` from
exiting. The main thread waits in short steps (`next_outcome`). remote.fanout and cluster.facts
fan out through here."""
from __future__ import annotations

import collections
import queue
import threading
from typing import Callable, Hashable, Iterable, TypeVar

T = TypeVar("T")

#: Seconds the main thread waits at a time for a fan-out's next outcome.
WAIT_STEP = 0.2


def next_outcome(done: queue.SimpleQueue) -> object:
    """The next item of `done`, waiting WAIT_STEP seconds at a time. A wait without a timeout is not
    woken by a signal the kernel hands to another thread (paramiko's, a fan-out's): Python runs its
    handler, the KeyboardInterrupt, only when the main thread next runs, which for a host that never
    answers was never (seen: `up` interrupted in its facts stage went on until the commands' own
    30 s timeout). A C queue, not threading.Condition: a KeyboardInterrupt raised in the Python
    clean-up of Condition.wait can leave its lock released twice (`RuntimeError: release unlocked
    lock`)."""
    while True:
        try:
            return done.get(timeout=WAIT_STEP)
        except queue.Empty:
            continue


def outcomes(items: Iterable[T], fn: Callable[[T], object], key: Callable[[T], Hashable], threads: int,
             name: str = "fanout",
             on_outcome: Callable[[Hashable, object], None] | None = None) -> dict[Hashable, object]:
    """key(item) -> fn(item) or the exception it raised, for every item, on `threads` daemon threads;
    on an interrupt what has not started does not start. on_outcome(key, outcome) runs on the calling
    thread as each one arrives."""
    items = list(items)
    todo = collections.deque(items)
    done: queue.SimpleQueue = queue.SimpleQueue()
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            try:
                item = todo.popleft()
            except IndexError:
                return
            k = key(item)
            try:
                outcome: object = fn(item)
            except BaseException as exc:  # noqa: BLE001 - carried in the outcome, as a Future would
                outcome = exc
            done.put((k, outcome))

    for i in range(min(threads, len(items))):
        threading.Thread(target=work, name=f"{name}-{i}", daemon=True).start()
    got: dict[Hashable, object] = {}
    try:
        for _ in range(len(items)):
            k, outcome = next_outcome(done)
            got[k] = outcome
            if on_outcome is not None:
                on_outcome(k, outcome)
    finally:
        stop.set()
    return got
