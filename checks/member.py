"""One member of a serving group (replica): run vLLM, and fall with the group.

Runs as the serve container's command on every host of a replica (Docker restarts the container
when it exits; a keeper restarts it when it was killed). A multi-node vLLM group cannot survive
the loss of one member: the others hang in their collectives. So the members hold a TCP
connection to the group's head (rank 0): the head starts vLLM only when every member is
connected and tells them to start theirs; when any member, the head or a vLLM process goes away,
every member stops its vLLM and exits non-zero, and the whole group restarts and meets again.

Args: RANK NODES COORD_HOST COORD_PORT -- VLLM ARGV...
SIGTERM (docker stop): vLLM gets SIGTERM, then the member exits 0. The API server's vLLM (rank 0)
finishes its in-flight requests first when it can: where the vLLM in the image takes
--shutdown-timeout (vLLM 0.18 and later) and the command does not set it, the member adds
--shutdown-timeout (the stop grace less 5 s); without it vLLM aborts them. A rollout stops the
head first, so the other members are still there while those requests finish.
"""
import os
import select
import signal
import socket
import subprocess
import sys
import time

STOP_GRACE = float(os.environ.get("BOOTSTRAP_STOP_GRACE", "30"))
#: Seconds a vLLM whose group lost a member gets to exit before it is killed: its collectives cannot
#: finish, so there is nothing to drain, and every second here is a second the replica is out.
BROKEN_GRACE = 2.0
#: Seconds between a member's tries to reach its head while the group meets again.
RETRY = 0.25
_stopping = False


def log(msg):
    print(f"[bootstrap-member] {msg}", file=sys.stderr, flush=True)


def keepalive(sock):
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, val in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)


def engine_takes(flag):
    """Whether the vLLM in this image takes FLAG: read from its argument parser's source (vllm is
    not imported: that takes seconds and loads torch)."""
    import importlib.util
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return False
    for d in (spec.submodule_search_locations or []) if spec else []:
        try:
            with open(os.path.join(d, "engine", "arg_utils.py"), encoding="utf-8") as fh:
                return f'"{flag}"' in fh.read()
        except OSError:
            continue
    return False


def with_drain_on_stop(argv, grace):
    """ARGV, with --shutdown-timeout added where it is vLLM's API server, the flag is not set,
    and the engine takes it."""
    if len(argv) < 2 or os.path.basename(argv[0]) != "vllm" or argv[1] != "serve" or "--headless" in argv:
        return argv
    if any(a == "--shutdown-timeout" or a.startswith("--shutdown-timeout=") for a in argv):
        return argv
    if not engine_takes("--shutdown-timeout"):
        log("this vLLM has no --shutdown-timeout: a stop aborts its in-flight requests")
        return argv
    seconds = max(1, int(grace) - 5)
    log(f"vLLM finishes in-flight requests on stop: --shutdown-timeout {seconds}")
    return [*argv, "--shutdown-timeout", str(seconds)]


def start_vllm(argv):
    log("starting " + " ".join(argv[:3]) + " ...")
    return subprocess.Popen(argv, start_new_session=True)


def stop_vllm(proc, grace):
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        log(f"vLLM did not stop within {grace:g}s: killing it")
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def on_term(signum, frame):
    global _stopping
    _stopping = True


def watch(proc, socks):
    """Until vLLM exits, a peer goes away, or we are told to stop: returns why."""
    while True:
        if _stopping:
            return "stop"
        if proc.poll() is not None:
            return f"vLLM exited with status {proc.returncode}"
        if socks:
            try:
                ready, _, _ = select.select(socks, [], [], 0.5)
            except InterruptedError:
                continue
            for s in ready:
                try:
                    data = s.recv(64)
                except OSError:
                    data = b""
                if not data:
                    return "a member of the group went away"
        else:
            time.sleep(0.5)


def head(nodes, host, port, argv):
    srv = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port))
    srv.listen(nodes)
    srv.settimeout(0.5)
    members = {}
    log(f"waiting for {nodes - 1} member(s) on {host}:{port}")
    while len(members) < nodes - 1:
        if _stopping:
            return 0
        try:
            conn, addr = srv.accept()
        except socket.timeout:
            continue
        conn.settimeout(5)
        try:
            rank = int(conn.recv(16).decode().strip() or "0")
        except (OSError, ValueError):
            conn.close()
            continue
        conn.settimeout(None)
        keepalive(conn)
        if rank in members:
            members[rank].close()
        members[rank] = conn
        log(f"member {rank} joined from {addr[0]}")
    srv.close()  # a member that restarts must not queue on this (finished) rendezvous
    for conn in members.values():
        conn.sendall(b"go\n")
    proc = start_vllm(argv)
    why = watch(proc, list(members.values()))
    stop_vllm(proc, STOP_GRACE if why == "stop" else BROKEN_GRACE)
    for conn in members.values():
        conn.close()
    if why == "stop":
        return 0
    log(f"{why}: the group restarts")
    return 1


def member(rank, host, port, argv):
    while not _stopping:
        try:
            sock = socket.create_connection((host, port), timeout=3)
            break
        except OSError:
            time.sleep(RETRY)
    else:
        return 0
    keepalive(sock)
    sock.sendall(f"{rank}\n".encode())
    sock.settimeout(None)
    buf = b""
    while b"\n" not in buf:
        if _stopping:
            return 0
        r, _, _ = select.select([sock], [], [], 0.5)
        if r:
            data = sock.recv(16)
            if not data:
                log("the group's head went away before the start")
                return 1
            buf += data
    proc = start_vllm(argv)
    why = watch(proc, [sock])
    stop_vllm(proc, STOP_GRACE if why == "stop" else BROKEN_GRACE)
    sock.close()
    if why == "stop":
        return 0
    log(f"{why}: the group restarts")
    return 1


def main(argv):
    sep = argv.index("--")
    rank, nodes, host, port = int(argv[0]), int(argv[1]), argv[2], int(argv[3])
    cmd = with_drain_on_stop(argv[sep + 1:], STOP_GRACE)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    if nodes == 1:
        proc = start_vllm(cmd)
        why = watch(proc, [])
        stop_vllm(proc, STOP_GRACE if why == "stop" else BROKEN_GRACE)
        if why != "stop":
            log(why)
        return 0 if why == "stop" else 1
    if rank == 0:
        return head(nodes, host, port, cmd)
    return member(rank, host, port, cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
