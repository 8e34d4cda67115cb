"""Shared by several test modules (moved from tests/test_sandbox_cluster.py)."""
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


CONTAINER = "bootstrap-vllm"


def shared_shape():
    """The shape of the 3-node sandbox the cluster, checks, faults and serve modules share, and of the
    4-node fleet grown from it: two fake GPUs per node, no HCA. The CPU inventory does not notice
    (no --gpus, no GPU fact asked); the GPU inventory beside it runs the GPU paths on the same nodes
    and the same pulled image (bootstrap.sandbox.gpu)."""
    from bootstrap.sandbox import GpuShape

    return GpuShape(gpus=2)


def cli(*args, timeout=900):
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "bootstrap", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=timeout)
    r.seconds = time.monotonic() - t
    print(f"$ bootstrap {' '.join(args)}  -> {r.returncode} in {r.seconds:.1f}s\n{r.stdout}\n{r.stderr}")
    return r


def on_node(node, *argv, check=True):
    """Run a command inside a simulated host (not through the tool)."""
    return subprocess.run(["docker", "exec", node.container, *argv], capture_output=True, text=True,
                          check=check, timeout=300)


def container_id(node):
    r = on_node(node, "docker", "inspect", "--format", "{{.Id}}", CONTAINER, check=False)
    return r.stdout.strip() if r.returncode == 0 else None


def node_env(node, name):
    r = on_node(node, "docker", "inspect", "--format", "{{json .Config.Env}}", CONTAINER)
    env = dict(e.split("=", 1) for e in json.loads(r.stdout))
    return env.get(name)


def ray_alive_ips(head):
    """Node IPs Ray reports alive, asked from inside the head container with Ray's own API. Each
    IP once: a recreated worker's old registration stays listed as alive (next to the new one)
    until its heartbeats time out."""
    code = ("import json, ray; ray.init(address='auto', logging_level='ERROR'); "
            "print(json.dumps(sorted({n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']})))")
    r = on_node(head, "docker", "exec", CONTAINER, "python3", "-c", code)
    return json.loads(r.stdout.strip().splitlines()[-1])


def ray_alive_ids(head):
    """{node IP: [alive NodeIDs]} from Ray's own API in the head container."""
    code = ("import json, ray; ray.init(address='auto', logging_level='ERROR'); d = {}\n"
            "for n in ray.nodes():\n"
            "    if n['Alive']: d.setdefault(n['NodeManagerAddress'], []).append(n['NodeID'])\n"
            "print(json.dumps(d))")
    r = on_node(head, "docker", "exec", CONTAINER, "python3", "-c", code)
    return json.loads(r.stdout.strip().splitlines()[-1])


def write_inventory(src, dst, mutate):
    doc = yaml.safe_load(Path(src).read_text())
    mutate(doc)
    Path(dst).write_text(yaml.safe_dump(doc))
    return str(dst)
