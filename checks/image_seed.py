"""Serve one stream to the peers that need it, and pass it on. Runs on a node that has the payload
(the image: in a throw-away container of the image, stdin `docker save IMAGE`; a model directory:
in the cluster container, reading `tar` itself), or on a node that receives it from the one before
it in a chain (a model directory: `--from`), started by bootstrap over SSH.

argv: BIND_IP PORT PEER_IPS(comma-separated, may be empty) WAIT_S [options]
  --source-json '["tar", ...]'  read this command's output instead of stdin (its exit status is checked)
  --from SRC_IP                 read SRC_IP:PORT instead (connect from BIND_IP, retried for WAIT_S)
  --sink-json '["tar", ...]'     also write the stream into this command (reported: its last JSON line,
                                else {"ok": exit status 0})

Listens on BIND_IP:PORT (the node's data-plane address) for up to WAIT_S seconds until every peer
has connected; a connection from any other address is closed unanswered. Then copies the stream to
every connected peer at once (one read for all of them, and into the sink), and closes each stream
at the end. A peer that stops reading for STALL_S seconds is dropped; the others go on.

Prints one JSON line: {"bytes", "sha256", "seconds", "served": [ip], "failed": {ip: why},
"missing": [ip], "error", "sink"}; exit 0 when the whole stream was read (from its source) and
every step asked for worked for at least one peer, NO_SENDER when --from never connected, 1 otherwise.
"""
import hashlib
import json
import socket
import subprocess
import sys
import time

CHUNK = 1 << 20
STALL_S = 120.0
NO_SENDER = 111


def accept_peers(srv, peers, deadline):
    conns = {}
    while len(conns) < len(peers):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        srv.settimeout(left)
        try:
            c, addr = srv.accept()
        except socket.timeout:
            break
        if addr[0] not in peers or addr[0] in conns:
            c.close()
            continue
        c.settimeout(STALL_S)
        conns[addr[0]] = c
    return conns


def listen(ip, port, backlog, deadline):
    """The listening socket; a port still held (a sender of an interrupted copy, which ends within its
    own wait) is tried again until the deadline."""
    while True:
        srv = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            srv.bind((ip, port))
            srv.listen(backlog)
            return srv
        except OSError:
            srv.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def connect(src, port, bind_ip, deadline):
    """A connection to the node before this one (from this node's data-plane address), or None."""
    while True:
        left = deadline - time.monotonic()
        try:
            c = socket.create_connection((src, port), timeout=max(1.0, min(left, 10.0)), source_address=(bind_ip, 0))
            c.settimeout(STALL_S)
            return c
        except OSError:
            if left <= 0:
                return None
            time.sleep(0.05)  # the node before it starts at the same time: its listen comes within moments


def option(argv, name):
    return argv[argv.index(name) + 1] if name in argv else None


def main(argv):
    ip, port, wait = argv[0], int(argv[1]), float(argv[3])
    peers = {p for p in argv[2].split(",") if p}
    source, src_ip, sink = option(argv, "--source-json"), option(argv, "--from"), option(argv, "--sink-json")
    deadline = time.monotonic() + wait
    out = {"bytes": 0, "sha256": None, "seconds": 0.0, "served": [], "failed": {}, "missing": [], "error": None}
    srv = listen(ip, port, len(peers) + 8, deadline) if peers else None  # before connecting: the next may come
    proc = feed = None
    conns = {}
    try:
        if src_ip:
            up = connect(src_ip, port, ip, deadline)
            if up is None:
                out["error"] = f"nothing answers on {src_ip}:{port} (tried for {wait:g}s)"
                print(json.dumps(out), flush=True)
                return NO_SENDER
            src = up.makefile("rb")
        elif source:
            proc = subprocess.Popen(json.loads(source), stdout=subprocess.PIPE)
            src = proc.stdout
        else:
            src = sys.stdin.buffer
        if srv is not None:
            conns = accept_peers(srv, peers, deadline)
    finally:
        if srv is not None:
            srv.close()
    if sink:
        feed = subprocess.Popen(json.loads(sink), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out["missing"] = sorted(peers - set(conns))
    digest, sent, failed = hashlib.sha256(), 0, out["failed"]
    t = time.monotonic()
    try:
        while conns or feed is not None and feed.stdin is not None and not feed.stdin.closed:
            chunk = src.read1(CHUNK) if hasattr(src, "read1") else src.read(CHUNK)
            if not chunk:
                break
            digest.update(chunk)
            sent += len(chunk)
            if feed is not None and not feed.stdin.closed:
                try:
                    feed.stdin.write(chunk)
                except OSError as exc:  # the sink stopped reading: its own output says why
                    out["error"] = f"the sink stopped reading: {type(exc).__name__}"
                    feed.stdin.close()
            for peer, c in list(conns.items()):
                try:
                    c.sendall(chunk)
                except OSError as exc:
                    failed[peer] = f"{type(exc).__name__}: {exc}"
                    conns.pop(peer).close()
    except OSError as exc:  # the node before this one went away, or the source's pipe broke
        out["error"] = f"the stream stopped: {type(exc).__name__}: {exc}"
    for peer, c in conns.items():
        try:
            c.shutdown(socket.SHUT_WR)
            out["served"].append(peer)
        except OSError as exc:
            failed[peer] = f"{type(exc).__name__}: {exc}"
        c.close()
    out["served"].sort()
    if proc is not None:
        proc.stdout.close()
        code = proc.wait()
        if code != 0:
            out["error"] = f"the source exited {code}"
    if feed is not None:
        if not feed.stdin.closed:
            feed.stdin.close()
        lines = [ln for ln in feed.stdout.read().decode(errors="replace").splitlines() if ln.startswith("{")]
        code = feed.wait()
        try:  # a sink that reports in JSON, else its exit status
            out["sink"] = json.loads(lines[-1]) if lines else {
                "ok": code == 0, "error": None if code == 0 else f"the sink exited {code}"}
        except ValueError:
            out["sink"] = {"ok": False, "error": lines[-1][:300]}
    out.update(bytes=sent, sha256=digest.hexdigest(), seconds=round(time.monotonic() - t, 2))
    print(json.dumps(out), flush=True)
    ok = out["error"] is None and (out["served"] or not peers) and (feed is None or out["sink"].get("ok"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
