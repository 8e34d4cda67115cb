"""Bounded parallel fan-out over hosts: a result per host, one error carrying them all."""
from __future__ import annotations

from typing import Callable, Iterable, TypeVar

from bootstrap.errors import GroupError
from bootstrap.parallel import outcomes

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
    """fn over items on `threads` daemon threads (bootstrap.parallel), each outcome into results."""
    results.update(outcomes(items, fn, key, threads))


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
