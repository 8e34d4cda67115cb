"""Pure parts of serve: which variables must not be copied from the head, how commands are launched."""
import subprocess

from bootstrap.serve import LOG, PIDFILE, _DETACH, _detached, per_node_env_names
from plan_fixtures import gpu_inventory


def test_per_node_nccl_variables_are_kept_from_the_head():
    inv = gpu_inventory()  # NCCL_SOCKET_IFNAME differs (ens5/ens6), NCCL_DEBUG is the same everywhere
    assert per_node_env_names(inv) == ["NCCL_SOCKET_IFNAME"]


def test_detached_launch_keeps_every_argument_whole(tmp_path):
    argv = ("vllm", "serve", "/models/my model $(touch /tmp/pwned)", "--max-model-len", "256")
    cmd = _detached("bootstrap-vllm", argv)
    assert cmd[:4] == ("docker", "exec", "-d", "bootstrap-vllm")
    assert cmd[-len(argv):] == argv
    # Run the same sh -c program locally with printf standing in for vllm: arguments arrive intact.
    log, pid = tmp_path / "log", tmp_path / "pid"
    prog = _DETACH.replace(LOG, str(log)).replace(PIDFILE, str(pid))
    subprocess.run(["sh", "-c", prog, "sh", "printf", "%s\\n", *argv[2:]], check=True)
    assert log.read_text().splitlines() == list(argv[2:])
    assert pid.read_text().strip().isdigit()
