"""Shared by several test modules (moved from tests/test_sandbox_cluster.py)."""
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from bootstrap.sandbox.layout import NETWORK

ROOT = Path(__file__).resolve().parents[2]


CONTAINER = "bootstrap-vllm"


def shared_shape():
    """The shape of the 3-node sandbox the cluster, checks, faults and serve modules share, and of the
    4-node fleet grown from it: two fake GPUs per node, no HCA. The CPU inventory does not notice
    (no --gpus, no GPU fact asked); the GPU inventory beside it runs the GPU paths on the same nodes
    and the same pulled image (bootstrap.sandbox.gpu)."""
    from bootstrap.sandbox import GpuShape

    return GpuShape(gpus=2)


def shared_sandbox() -> dict:
    """sandbox_up's shape arguments for the shared sandbox: shared_shape()'s GPUs, on a mixed rack (issue 63):
    node3 is Debian 13 with Docker 26.1, the containerd image store and its GPUs through CDI only, beside
    Debian 12 nodes with Docker 20.10 and the toolkit's hook, so every module of it meets both."""
    return {"gpu": shared_shape(), "mixed": True}


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
            "print('RAY-JSON', json.dumps(sorted({n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']})))")
    r = on_node(head, "docker", "exec", CONTAINER, "python3", "-c", code)
    return _marked_json(r.stdout)


def ray_alive_ids(head):
    """{node IP: [alive NodeIDs]} from Ray's own API in the head container."""
    code = ("import json, ray; ray.init(address='auto', logging_level='ERROR'); d = {}\n"
            "for n in ray.nodes():\n"
            "    if n['Alive']: d.setdefault(n['NodeManagerAddress'], []).append(n['NodeID'])\n"
            "print('RAY-JSON', json.dumps(d))")
    r = on_node(head, "docker", "exec", CONTAINER, "python3", "-c", code)
    return _marked_json(r.stdout)


def _marked_json(stdout):
    """The document after the RAY-JSON marker: Ray may print its own lines after it (a warning about
    a dead node's lagging heartbeats printed at the driver's exit did, in CI)."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RAY-JSON ")]
    assert lines, stdout
    return json.loads(lines[-1][len("RAY-JSON "):])


def write_inventory(src, dst, mutate):
    doc = yaml.safe_load(Path(src).read_text())
    mutate(doc)
    Path(dst).write_text(yaml.safe_dump(doc))
    return str(dst)


#: Connects to every (ip, port) given as ip=port,port,... and prints "ip port open|refused|<error>".
_SCAN = r"""
import concurrent.futures as cf, socket, sys
targets = [(h, int(p)) for a in sys.argv[1:] for h, ps in [a.split("=")] for p in ps.split(",") if p]
def probe(t):
    s = socket.socket(socket.AF_INET6 if ":" in t[0] else socket.AF_INET)
    s.settimeout(3)
    try:
        s.connect(t)
        return t, "open"
    except ConnectionRefusedError:
        return t, "refused"
    except OSError as e:
        return t, type(e).__name__
    finally:
        s.close()
with cf.ThreadPoolExecutor(32) as ex:
    for (h, p), r in ex.map(probe, targets):
        print(h, p, r)
"""


def listeners(node):
    """(bind address, port) of every TCP socket listening on the node (the host's network namespace)."""
    out = on_node(node, "ss", "-ltnH").stdout
    found = []
    for line in out.splitlines():
        local = line.split()[3]
        addr, _, port = local.rpartition(":")
        found.append((addr.strip("[]"), int(port)))
    return found


def stranger_scan(nodes, network=NETWORK):
    """From a container on the sandbox network that is no member of the cluster, try every port each
    node listens on (except loopback-only ones): {(ip, port): "open" | "refused" | error}."""
    args = []
    for n in nodes:
        ports = sorted({p for a, p in listeners(n) if not a.startswith("127.") and a != "::1"})
        args.append(f"{n.ip}=" + ",".join(map(str, ports)))
    image = subprocess.run(["docker", "inspect", "--format", "{{.Config.Image}}", nodes[0].container],
                           capture_output=True, text=True, check=True).stdout.strip()
    r = subprocess.run(["docker", "run", "--rm", "--network", network, "--entrypoint", "python3", image,
                        "-c", _SCAN, *args], capture_output=True, text=True, timeout=120, check=True)
    return {(ip, int(port)): res for ip, port, res in (ln.split() for ln in r.stdout.splitlines())}


def writable_layers(node, containers):
    """Where the containers' writable layers are on `node`, for a search: each one's directory on Docker's
    classic store (GraphDriver.Data.UpperDir); on its containerd store (the mixed rack's node3), which names
    none, the snapshots directory that holds them (with the image layers: a slower search)."""
    uppers = on_node(node, "docker", "inspect", "--format", "{{.GraphDriver.Data.UpperDir}}", *containers,
                     check=False).stdout.split()
    if len(uppers) == len(containers) and all(u.startswith("/") for u in uppers):
        return uppers
    return ["/var/lib/docker/containerd"]


def nft_ruleset(node):
    """The node's rules (`nft -s list ruleset`: no counters) as (table, chain, line) for every rule and
    every base chain's hook and policy line, in order; a chain with no rule and an accept policy (a
    table ip6tables made and left empty) is no rule and is left out. Compare before and after."""
    out, table, chain, body = [], None, None, []
    for raw in on_node(node, "nft", "-s", "list", "ruleset").stdout.splitlines():
        line = raw.strip()
        if line.startswith("table "):
            table = line.rstrip(" {")
        elif line.startswith("chain "):
            chain, body = line.rstrip(" {"), []
        elif line == "}" and chain is not None:
            rules = [b for b in body if not b.startswith("type ")]
            if rules or any("policy drop" in b for b in body):
                out += [(table, chain, b) for b in body]
            chain = None
        elif chain is not None and line:
            body.append(line)
    return out


_POST = r"""
import sys, urllib.error, urllib.request
req = urllib.request.Request(sys.argv[1], sys.argv[2].encode(), {"Content-Type": "application/json"})
try:
    print(urllib.request.urlopen(req, timeout=60).status)
except urllib.error.HTTPError as e:
    print(e.code)
"""


def stranger_post(nodes, url, body, network=NETWORK):
    """POST `body` (JSON text) to `url` from a container on the sandbox network that is no member of
    the cluster, without credentials: the HTTP status it gets."""
    image = subprocess.run(["docker", "inspect", "--format", "{{.Config.Image}}", nodes[0].container],
                           capture_output=True, text=True, check=True).stdout.strip()
    r = subprocess.run(["docker", "run", "--rm", "--network", network, "--entrypoint", "python3", image,
                        "-c", _POST, url, body], capture_output=True, text=True, timeout=120, check=True)
    return int(r.stdout.strip())


def up_serve_down(sb, inv, *serve_args):
    """A fleet or pool fixture's life: `up` and `serve` (their result yielded), then `down`, which
    leaves no container of ours on any node."""
    r = cli("up", "--yes", "-i", inv)
    assert r.returncode == 0, r.stderr[-3000:]
    served = cli("serve", "-i", inv, *serve_args)
    assert served.returncode == 0, served.stderr[-3000:]
    yield served
    r = cli("down", "--yes", "-i", inv)
    assert r.returncode == 0, r.stderr[-2000:]
    for n in sb.nodes:  # down leaves nothing of the fleet behind
        left = on_node(n, "docker", "ps", "-a", "--format", "{{.Names}}").stdout.split()
        assert not [c for c in left if c.startswith("bootstrap-vllm")], (n.name, left)


def firewalld_on(node):
    """Start firewalld on a node (installed on every node, started on none: bootstrap/sandbox/recipes.py),
    with its default zone (public: SSH in, every other port rejected), as a RHEL or Rocky host runs it."""
    on_node(node, "sh", "-c", "mkdir -p /run/dbus && (pgrep -x dbus-daemon >/dev/null || dbus-daemon --system --fork) "
            "&& (pgrep -x firewalld >/dev/null || firewalld) && for i in $(seq 60); do "
            "[ \"$(firewall-cmd --state 2>/dev/null)\" = running ] && exit 0; sleep 0.5; done; exit 1")


def firewalld_off(node):
    """firewalld stopped (its rules go with it: CleanupOnExit) and its permanent zones as installed."""
    on_node(node, "sh", "-c", "pkill -x firewalld; for i in $(seq 40); do pgrep -x firewalld >/dev/null || break; "
            "sleep 0.25; done; rm -f /etc/firewalld/zones/*.xml /etc/firewalld/zones/*.xml.old", check=False)
