"""The GCS gate `up` runs on the head host before starting workers: real bash, a real socket."""
import socket
import subprocess
import threading
import time

from bootstrap.cluster.ray import GCS_GATE, gcs_wait_argv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_argv_bounds_the_wait_and_passes_address_as_arguments():
    assert gcs_wait_argv("10.0.0.1", 6379, 300) == ("timeout", "300", "bash", "-c", GCS_GATE, "10.0.0.1", "6379")
    assert gcs_wait_argv("10.0.0.1", 6379, 0)[1] == "1"  # never a zero timeout (no wait at all)


def test_gate_returns_once_the_port_opens():
    port = free_port()
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def open_later():
        time.sleep(0.8)
        srv.bind(("127.0.0.1", port))
        srv.listen()

    t = threading.Thread(target=open_later)
    t0 = time.monotonic()
    t.start()
    try:
        r = subprocess.run(gcs_wait_argv("127.0.0.1", port, 20), capture_output=True, timeout=30)
        took = time.monotonic() - t0
    finally:
        t.join()
        srv.close()
    assert r.returncode == 0, r.stderr
    assert 0.7 <= took < 10, took


def test_gate_times_out_with_timeouts_status_when_nothing_listens():
    port = free_port()
    r = subprocess.run(gcs_wait_argv("127.0.0.1", port, 1), capture_output=True, timeout=30)
    assert r.returncode == 124
