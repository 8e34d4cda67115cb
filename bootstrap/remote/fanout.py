"""Bounded parallel fan-out over hosts: a result per host, one error carrying them all."""
from __future__ import annotations

import collections
import queue
import threading
from typing import Callable, Iterable, TypeVar

from bootstrap.errors import GroupError

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_PARALLEL = 32


class GroupResult(dict):
    """key -> the result of one item, or the exception it raised (like Fabric's GroupResult).

    A plain dict (input order) with two views: `succeeded` (key -> result) and `failed`
    (key -> exception). Both are read when asked, so they follow changes to the dict.
    """

    @property
    def succeeded(self) -> dict:
        return {k: v for k, v in self.items() if not isinstance(v, BaseException)}

    @property
    def failed(self) -> dict:
        return {k: v for k, v in self.items() if isinstance(v, BaseException)}


def fan_out(
    items: Iterable[T],
    fn: Callable[[T], R],
    *,
    key: Callable[[T], str],
    parallel: int = DEFAULT_PARALLEL,
) -> GroupResult:
    """Run ``fn`` on every item with at most ``parallel`` at once.

    Returns a :class:`GroupResult`, ``{key(item): result or the exception it raised}`` in input
    order. Never raises for a single item's failure; KeyboardInterrupt stops waiting and cancels
    what has not started. The threads are daemons: one stuck in a command that never answers
    (a hung host) does not keep the process from exiting after an interrupt.
    """
    items = list(items)
    results = GroupResult()
    if not items:
        return results
    results.update((key(i), None) for i in items)
    if len(items) == 1 or parallel <= 1:
        for item in items:
            try:
                results[key(item)] = fn(item)
            except Exception as exc:  # noqa: BLE001 - carried in the result
                results[key(item)] = exc
        return results
    _pooled(items, fn, key, min(parallel, len(items)), results)
    return results


def _pooled(items: list[T], fn: Callable[[T], R], key: Callable[[T], str], threads: int,
            results: GroupResult) -> None:
    """fn over items on `threads` daemon threads, each outcome into results. Not a
    ThreadPoolExecutor: its threads are joined when the interpreter exits (and by shutdown(wait=True)),
    so a thread blocked on a host that never answers kept an interrupted `up` from exiting. The main
    thread waits in short steps (`next_outcome`)."""
    todo = collections.deque(items)
    done: queue.SimpleQueue = queue.SimpleQueue()
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            try:
                item = todo.popleft()
            except IndexError:
                return
            name = key(item)
            try:
                outcome: object = fn(item)
            except BaseException as exc:  # noqa: BLE001 - carried in the result, as a Future would
                outcome = exc
            done.put((name, outcome))

    for i in range(threads):
        threading.Thread(target=work, name=f"fanout-{i}", daemon=True).start()
    try:
        for _ in range(len(items)):
            name, outcome = next_outcome(done)
            results[name] = outcome
    finally:
        stop.set()  # on an interrupt: what has not started does not start


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


def run_all(
    stage: str,
    items: Iterable[T],
    fn: Callable[[T], R],
    *,
    key: Callable[[T], str],
    parallel: int = DEFAULT_PARALLEL,
) -> GroupResult:
    """Like :func:`fan_out` but raise one :class:`GroupError` (with every host's result) on failure."""
    results = fan_out(items, fn, key=key, parallel=parallel)
    if results.failed:
        raise GroupError(stage, results)
    return results
