"""Wait until the expected nodes are alive in the Ray cluster; print JSON lines.

Runs INSIDE the head container, fed on stdin by `bootstrap` (`docker exec -i ... python - ARGS`),
so Ray is imported once and the GCS is polled every --interval seconds: the cluster is reported
ready within one interval of the last node joining.

Output: one JSON object per line. {"event": "progress", ...} whenever the set of alive nodes
changes, and a final {"event": "done", "ready": bool, "nodes": [...], "missing": [...],
"first_seen": {ip: time.time()}, "now": time.time()}. first_seen is when this poller first saw
each node alive (within one --interval of Ray listing it; for a node already alive at the first
poll, that poll's time), on the head container's clock (`now` is that clock at the end: compare
it with yours to see the skew before mixing these times with another machine's).
Exit status: 0 ready, 3 deadline passed, 2 cannot reach the GCS.
"""
import argparse
import json
import socket
import sys
import time


def _port_open(address, timeout=0.5):
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def _node_table(address):
    """Return a list of {ip, alive, gpus, cpus, node_id} from the GCS (no driver started)."""
    from ray._private import state as ray_state
    from ray._raylet import GcsClientOptions

    gs = ray_state.GlobalState()
    try:
        opts = GcsClientOptions.create(address, None, allow_cluster_id_nil=True,
                                       fetch_cluster_id_if_nil=False)
    except TypeError:  # older Ray signatures
        opts = GcsClientOptions.create(address, None, True, False)
    gs._initialize_global_state(opts)

    def fetch():
        out = []
        for n in gs.node_table():
            res = n.get("Resources") or {}
            out.append({"ip": n.get("NodeManagerAddress"), "alive": bool(n.get("Alive")),
                        "gpus": res.get("GPU", 0), "cpus": res.get("CPU", 0),
                        "node_id": n.get("NodeID")})
        return out
    return fetch


def _fallback(address):
    import ray
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)

    def fetch():
        return [{"ip": n["NodeManagerAddress"], "alive": n["Alive"],
                 "gpus": n["Resources"].get("GPU", 0), "cpus": n["Resources"].get("CPU", 0),
                 "node_id": n["NodeID"]} for n in ray.nodes()]
    return fetch


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True)
    p.add_argument("--expect", default="", help="comma-separated node IPs that must be alive")
    p.add_argument("--gpus", type=float, default=0, help="GPUs each expected node must report")
    p.add_argument("--deadline", type=float, default=0, help="seconds; 0 = report once and exit")
    p.add_argument("--interval", type=float, default=0.1)
    p.add_argument("--tag", default="", help="a marker in our command line (to find and stop us)")
    p.add_argument("--stale", default="", help="comma-separated node IDs that do not count: the "
                   "registrations of containers just replaced, which Ray lists as alive until their "
                   "heartbeats time out")
    a = p.parse_args(argv)
    expect = [x for x in a.expect.split(",") if x]
    stale = {x for x in a.stale.split(",") if x}
    start = time.monotonic()
    fetch = None
    while fetch is None:
        # Wait for the GCS port first: connecting Ray's client to a GCS that is not up yet
        # blocks for many seconds per attempt.
        while not _port_open(a.address):
            if time.monotonic() - start > a.deadline:
                print(json.dumps({"event": "done", "ready": False,
                                  "error": f"nothing listens at the Ray GCS address {a.address}",
                                  "nodes": [], "missing": expect}), flush=True)
                return 2
            time.sleep(a.interval)
        try:
            try:
                fetch = _node_table(a.address)
                fetch()
            except (ImportError, AttributeError):
                fetch = _fallback(a.address)
        except Exception as exc:  # GCS not up yet
            fetch = None
            if time.monotonic() - start > a.deadline:
                print(json.dumps({"event": "done", "ready": False, "nodes": [], "missing": expect,
                                  "error": f"cannot reach the Ray GCS at {a.address}: {exc}"}), flush=True)
                return 2
            time.sleep(min(1.0, a.interval * 5))
    seen = None
    first_seen = {}
    while True:
        try:
            nodes = fetch()
        except Exception:  # transient GCS error
            nodes = []
        alive = {n["ip"]: n for n in nodes if n["alive"] and n.get("node_id") not in stale}
        now = time.time()
        for ip in alive:
            first_seen.setdefault(ip, round(now, 3))
        missing = [ip for ip in expect if ip not in alive or alive[ip]["gpus"] < a.gpus]
        key = sorted((ip, n["gpus"]) for ip, n in alive.items())
        if key != seen:
            seen = key
            print(json.dumps({"event": "progress", "t": round(time.monotonic() - start, 3),
                              "alive": sorted(alive), "missing": missing}), flush=True)
        if not missing or time.monotonic() - start >= a.deadline:
            print(json.dumps({"event": "done", "ready": not missing, "t": round(time.monotonic() - start, 3),
                              "nodes": nodes, "missing": missing, "first_seen": first_seen,
                              "now": round(time.time(), 3)}), flush=True)
            return 0 if not missing else 3
        time.sleep(a.interval)


if __name__ == "__main__":
    sys.exit(main())
