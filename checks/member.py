"""One member of a serving group (replica): run vLLM, and start it again with the group.

Runs as the serve container's command on every host of a replica. A multi-node vLLM group cannot
survive the loss of one member: the others hang in their collectives. So the members hold a TCP
connection to the group's head (rank 0): the head starts vLLM only when every member is
connected and tells them to start theirs; when any member, the head or a vLLM process goes away,
every member stops its vLLM and the group meets again and starts anew. The supervisor itself stays:
it imported vLLM's command line once (preload) and each start is a fork of it, so a restart does
not import torch and vLLM again (seconds to tens of seconds on busy cores). It exits only when told
to stop; Docker restarts it if it dies, and a keeper when it was killed.

Standby: a container whose role file (ROLE, beside this script) says `standby` preloads vLLM and
waits; the keeper renames it to the serving name when the serving container was killed and sends
SIGUSR1: it then writes `active` there and serves, without the imports a fresh container pays. A
`standby delay=S` waits S seconds before its imports (it was the killed container, started again as
the next standby: its imports must not take the cores the take-over's start needs).

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
import traceback

STOP_GRACE = float(os.environ.get("BOOTSTRAP_STOP_GRACE", "30"))
#: Seconds a vLLM whose group lost a member gets to exit before it is killed: its collectives cannot
#: finish, so there is nothing to drain, and every second here is a second the replica is out.
BROKEN_GRACE = 2.0
#: Seconds between a member's tries to reach its head while the group meets again.
RETRY = 0.25
#: A vLLM that exits within this many seconds of its start is started again only after a pause
#: that doubles each time (1 s up to BACKOFF_MAX), as Docker's restart policy would.
QUICK_EXIT = 30.0
BACKOFF_MAX = 30.0
#: The member's own files: its role (standby or active) and how many times it started vLLM.
STATE_DIR = os.environ.get("BOOTSTRAP_MEMBER_STATE") or os.path.dirname(os.path.abspath(__file__))
ROLE = os.path.join(STATE_DIR, "member.role")
STARTS = os.path.join(STATE_DIR, "member.starts")
#: The last vLLM exit that was not asked for: "TIME why" (checks/fleet_probe.py's ready reads it: a
#: gate stops waiting for a vLLM that exited, as it did when the container exited with it)
EXITED = os.path.join(STATE_DIR, "member.exited")
#: What a preload imports: vLLM's command line and what `vllm serve` imports before its engine
#: starts (each optional but the first; other vLLM versions may lack one).
PRELOAD = ("vllm.entrypoints.cli.main", "vllm.entrypoints.cli.serve", "vllm.entrypoints.openai.api_server",
           "vllm.v1.engine.core")
_stopping = False
_activated = False
#: vLLM's command-line entry, once preloaded
_vllm_main = None
#: the supervisor's sockets: a forked vLLM closes its copies (else a peer never sees this one go)
_sockets = set()


def log(msg):
    print(f"[bootstrap-member] {msg}", file=sys.stderr, flush=True)


def keepalive(sock):
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, val in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)


def is_vllm_serve(argv):
    return len(argv) >= 2 and os.path.basename(argv[0]) == "vllm" and argv[1] == "serve"


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
    if not is_vllm_serve(argv) or "--headless" in argv:
        return argv
    if any(a == "--shutdown-timeout" or a.startswith("--shutdown-timeout=") for a in argv):
        return argv
    if not engine_takes("--shutdown-timeout"):
        log("this vLLM has no --shutdown-timeout: a stop aborts its in-flight requests")
        return argv
    seconds = max(1, int(grace) - 5)
    log(f"vLLM finishes in-flight requests on stop: --shutdown-timeout {seconds}")
    return [*argv, "--shutdown-timeout", str(seconds)]


def preload(argv):
    """Import vLLM's command line now (where ARGV is `vllm serve`), so that every start forks a
    process that has it instead of executing `vllm`, which imports torch and vLLM again. A vLLM
    that cannot be imported here is executed as a command, as before."""
    global _vllm_main
    if not is_vllm_serve(argv) or os.environ.get("BOOTSTRAP_PRELOAD", "1") == "0":
        return
    import importlib
    t = time.monotonic()
    try:
        cli = importlib.import_module(PRELOAD[0])
        for name in PRELOAD[1:]:
            try:
                importlib.import_module(name)
            except ImportError:
                pass
    except Exception as exc:  # any failure: vLLM runs as a command, and says itself what is wrong
        log(f"vLLM not preloaded ({type(exc).__name__}: {exc}): each start imports it")
        return
    _vllm_main = cli.main
    log(f"vLLM preloaded in {time.monotonic() - t:.1f}s: each start of it is a fork of this process")


class Forked:
    """A forked vLLM, with the part of Popen's interface the supervisor uses."""

    def __init__(self, pid):
        self.pid = pid
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout=None):
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired("vllm", timeout)
            time.sleep(0.05)
        return self.returncode


def _run_forked(argv):
    """In the forked child: vLLM's command line with ARGV, in a session of its own; never returns."""
    code = 1
    try:
        os.setsid()
        for s in list(_sockets):
            s.close()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)
        sys.argv = list(argv)
        _vllm_main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass
        os._exit(code)


def count_start():
    try:
        with open(STARTS, encoding="ascii") as fh:
            n = int(fh.read().strip() or 0)
    except (OSError, ValueError):
        n = 0
    try:
        with open(STARTS, "w", encoding="ascii") as fh:
            fh.write(f"{n + 1}\n")
    except OSError:
        pass


def start_vllm(argv):
    count_start()
    if _vllm_main is not None and is_vllm_serve(argv):
        log("starting " + " ".join(argv[:3]) + " ... (forked, vLLM already imported)")
        pid = os.fork()
        if pid == 0:
            _run_forked(argv)
        return Forked(pid)
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


def on_activate(signum, frame):
    global _activated
    _activated = True


def pause(seconds, until=lambda: False):
    """Sleep up to SECONDS, or until `until()` is true; False when told to stop first."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and not until():
        if _stopping:
            return False
        time.sleep(min(0.2, max(0.0, end - time.monotonic())))
    return not _stopping


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


def run_and_watch(argv, socks):
    proc = start_vllm(argv)
    why = watch(proc, socks)
    stop_vllm(proc, STOP_GRACE if why == "stop" else BROKEN_GRACE)
    if why.startswith("vLLM exited"):
        try:
            with open(EXITED, "w", encoding="utf-8") as fh:
                fh.write(f"{time.time():.3f} {why}\n")
        except OSError:
            pass
    return why


def _close(*socks):
    for s in socks:
        _sockets.discard(s)
        s.close()


def head_once(nodes, host, port, argv):
    """Gather the members, start vLLM, watch: why it ended ("stop" when told to)."""
    srv = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    _sockets.add(srv)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port))
    srv.listen(nodes)
    srv.settimeout(0.5)
    members = {}
    log(f"waiting for {nodes - 1} member(s) on {host}:{port}")
    try:
        while len(members) < nodes - 1:
            if _stopping:
                return "stop"
            try:
                conn, addr = srv.accept()
            except socket.timeout:
                continue
            _sockets.add(conn)
            conn.settimeout(5)
            try:
                rank = int(conn.recv(16).decode().strip() or "0")
            except (OSError, ValueError):
                _close(conn)
                continue
            conn.settimeout(None)
            keepalive(conn)
            if rank in members:
                _close(members[rank])
            members[rank] = conn
            log(f"member {rank} joined from {addr[0]}")
        _close(srv)  # a member that restarts must not queue on this (finished) rendezvous
        for conn in members.values():
            conn.sendall(b"go\n")
        return run_and_watch(argv, list(members.values()))
    finally:
        _close(srv, *members.values())


def member_once(rank, host, port, argv):
    """Join the head, start vLLM when it says so, watch: why it ended ("stop" when told to)."""
    while not _stopping:
        try:
            sock = socket.create_connection((host, port), timeout=3)
            break
        except OSError:
            time.sleep(RETRY)
    else:
        return "stop"
    _sockets.add(sock)
    try:
        keepalive(sock)
        sock.sendall(f"{rank}\n".encode())
        sock.settimeout(None)
        buf = b""
        while b"\n" not in buf:
            if _stopping:
                return "stop"
            r, _, _ = select.select([sock], [], [], 0.5)
            if r:
                data = sock.recv(16)
                if not data:
                    return "the group's head went away before the start"
                buf += data
        return run_and_watch(argv, [sock])
    finally:
        _close(sock)


def read_role():
    """('standby' or 'active', seconds to wait before a standby's imports)."""
    try:
        with open(ROLE, encoding="utf-8") as fh:
            words = fh.read().split()
    except OSError:
        return "active", 0.0
    role = words[0] if words else "active"
    delay = 0.0
    for w in words[1:]:
        if w.startswith("delay="):
            try:
                delay = max(0.0, float(w[6:]))
            except ValueError:
                pass
    return ("standby" if role == "standby" else "active"), delay


def stand_by(cmd, delay):
    """Preload vLLM and wait for the keeper's SIGUSR1; False when told to stop first."""
    log(f"standby: vLLM is imported {'in %gs ' % delay if delay else ''}and waits to serve in place of "
        "a killed serving container")
    if not pause(delay, until=lambda: _activated):
        return False
    preload(cmd)
    if not _activated:
        log("standby: ready")
    while not _activated:
        if not pause(0.2):
            return False
    with open(ROLE, "w", encoding="utf-8") as fh:
        fh.write("active\n")
    log("standby: now the serving container (the keeper renamed it): starting")
    return True


def main(argv):
    sep = argv.index("--")
    rank, nodes, host, port = int(argv[0]), int(argv[1]), argv[2], int(argv[3])
    cmd = with_drain_on_stop(argv[sep + 1:], STOP_GRACE)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGUSR1, on_activate)
    role, delay = read_role()
    if role == "standby":
        if not stand_by(cmd, delay):
            return 0
    else:
        preload(cmd)
    backoff = 0.0
    while True:
        t = time.monotonic()
        if nodes == 1:
            why = run_and_watch(cmd, [])
        elif rank == 0:
            why = head_once(nodes, host, port, cmd)
        else:
            why = member_once(rank, host, port, cmd)
        if why == "stop" or _stopping:
            return 0
        backoff = min(BACKOFF_MAX, max(1.0, 2 * backoff)) if time.monotonic() - t < QUICK_EXIT else 0.0
        log(f"{why}: the group starts again" + (f" in {backoff:g}s" if backoff else ""))
        if not pause(backoff):
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
