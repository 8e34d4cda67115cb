"""The library face's observing commands: top (a live view from Prometheus or probes) and the monitor.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

from bootstrap.errors import BootstrapError, UsageError
from bootstrap.face import results as R
from bootstrap.face.cluster import inventory
from bootstrap.remote.fanout import DEFAULT_PARALLEL
from bootstrap.remote.session import Session


class TopView:
    """What `top` looks at: look() takes a frame (from Prometheus, or a sample of every container
    compared with the one before); once() the first frame, --interval after the start."""

    def __init__(self, watcher, prometheus: str | None, interval: float):
        self.watcher, self.prometheus, self.interval = watcher, prometheus, interval

    def look(self):
        w = self.watcher
        if self.prometheus is not None:
            from bootstrap.monitor import run as MON

            return w.prometheus_frame(lambda expr: MON.query(w.sess, expr), self.prometheus, self.interval)
        w.sample()
        return w.frame(self.interval)

    def once(self):
        if self.prometheus is None:
            self.watcher.sample()
            time.sleep(self.interval)
        return self.look()


@contextmanager
def top(inv, *, source: str = "auto", interval: float = 2.0, on_fallback=None):
    """`top`'s view of every replica and node (a TopView), open while in the with block. source:
    prometheus, probe or auto (Prometheus when it runs); on_fallback(exc) when auto cannot ask the
    monitor host and samples with the probes instead."""
    from bootstrap.monitor import run as MON
    from bootstrap.monitor import top as T

    inv = inventory(inv, require_secrets=False)  # the probes read nothing secret
    prom = None
    if source != "probe":
        try:
            prom = MON.running_url(inv)
        except BootstrapError as exc:  # unreachable monitor host, or its Docker does not answer
            if source == "prometheus":
                raise  # names the host and why: not "Prometheus is not running"
            if on_fallback is not None:
                on_fallback(exc)
        if prom is None and source == "prometheus":
            raise UsageError("top --source prometheus: Prometheus is not running (bootstrap monitor up)")
    with T.Watcher(inv) as w:
        yield TopView(w, prom, interval)


def _monitor_session(inv, reporter=None, *, connect: bool = True, parallel: int = DEFAULT_PARALLEL):
    """connect=False: connect on first use (`monitor status` asks the monitor host only, and says so
    when that host is unreachable)."""
    inv = inventory(inv, require_secrets=False)  # nothing secret goes to the monitoring containers
    sess = Session(inv, reporter=reporter, parallel=parallel)
    if connect:
        sess.connect()
    return inv, sess


def monitor_up(inv, *, parallel: int = DEFAULT_PARALLEL, wait: float = 120.0, reporter=None) -> R.MonitorResult:
    """`monitor up`: the exporters and Prometheus started or updated; the targets' state."""
    from bootstrap.monitor import run as MON

    inv, sess = _monitor_session(inv, reporter, parallel=parallel)
    with sess:
        return R.MonitorResult(inv, MON.monitor_up(sess, wait=wait), "up")


def monitor_status(inv, *, parallel: int = DEFAULT_PARALLEL) -> R.MonitorResult:
    """`monitor status`: every scrape target up or down, as Prometheus sees it."""
    from bootstrap.monitor import run as MON

    inv, sess = _monitor_session(inv, connect=False, parallel=parallel)
    with sess:
        return R.MonitorResult(inv, MON.monitor_status(sess), "status")


def purge_preview(inv) -> str:
    """What `monitor down --purge` deletes, in one sentence from the inventory alone (no host contacted):
    what its confirmation shows."""
    from bootstrap.monitor import plan as MP

    inv = inventory(inv)
    return (f"monitor down --purge deletes the cluster {inv.cluster.name!r}'s stored Prometheus samples (the volume "
            f"{MP.volume_name(inv)} on {MP.monitor_host(inv).name}) and removes monitoring from {len(inv.hosts)} "
            f"host(s); inventory {inv.path}")


def monitor_down(inv, *, parallel: int = DEFAULT_PARALLEL, purge: bool = False, reporter=None) -> R.MonitorResult:
    """`monitor down`: Prometheus and the exporters removed from every host (purge: its samples too)."""
    from bootstrap.monitor import run as MON

    inv, sess = _monitor_session(inv, reporter, parallel=parallel)
    with sess:
        return R.MonitorResult(inv, MON.monitor_down(sess, purge=purge), "down", purge)
