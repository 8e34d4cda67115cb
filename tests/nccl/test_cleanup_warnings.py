"""check-nccl's clean-up of the check's processes: a failure is a warning naming the host (a hung rank
may still hold the GPUs), not silence. Pure."""
from bootstrap.errors import ConnectionLost
from bootstrap.nccl.run import cleanup_warnings
from bootstrap.remote.ssh import Result


def test_a_failed_cleanup_is_a_warning_per_host():
    got = cleanup_warnings("vllm-node", {
        "a": Result("a", "docker exec ...", 0, "", ""),
        "b": Result("b", "docker exec ...", 1, "", "Cannot connect to the Docker daemon"),
        "c": ConnectionLost("c", "connection lost while running `docker exec ...`"),
        "d": Result("d", "docker exec ...", 1, "", "Error response from daemon: container 1 is not running"),
    })
    assert len(got) == 2
    assert got[0].startswith("b: could not stop the check's processes in vllm-node (Cannot connect")
    assert got[1].startswith("c: could not stop") and "connection lost" in got[1]
