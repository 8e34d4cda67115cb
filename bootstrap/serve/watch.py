"""Say what vLLM is doing while a caller waits for it to serve: a thread polls the tail of vLLM's
log and reports each step serve/progress.py recognizes (new steps at once, a heartbeat while one
lasts). The wait itself (checks/serve_probe.py, the fleet's gate) decides ready or failed; a read of
the log that fails only skips that report."""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator

from bootstrap.serve import progress as P

#: Seconds between two reads of the log's tail.
POLL_S = 2.0
#: Bytes of the log's tail read each time (a progress bar's redraws included).
TAIL_BYTES = 65536


@contextlib.contextmanager
def watching(report: Callable[[str], None], read: Callable[[], str], *, poll: float = POLL_S,
             clock: Callable[[], float] = time.monotonic) -> Iterator[P.Progress]:
    """While the block runs: every POLL seconds read() the log's tail and report(line) what changed."""
    stop = threading.Event()
    progress = P.Progress()

    def loop() -> None:
        while not stop.wait(poll):
            try:
                text = read()
            except Exception:  # noqa: BLE001 - the wait decides; this only skips one report
                continue
            line = progress.update(P.latest_step(text), clock())
            if line and not stop.is_set():
                report(line)
    t = threading.Thread(target=loop, name="vllm-progress", daemon=True)
    t.start()
    try:
        yield progress
    finally:
        stop.set()
        t.join(timeout=1.0)
