"""Serve one image stream to the peers that need it. Runs in a throw-away container of the image
on a node that has it: stdin is `docker save IMAGE`, started by bootstrap over SSH.

argv: BIND_IP PORT PEER_IPS(comma-separated) WAIT_S
Listens on BIND_IP:PORT (the node's data-plane address) for up to WAIT_S seconds until every peer
has connected; a connection from any other address is closed unanswered. Then copies stdin to
every connected peer at once (one `docker save` for all of them) and closes each stream at the end.
A peer that stops reading for STALL_S seconds is dropped; the others go on.

Prints one JSON line: {"bytes", "sha256", "seconds", "served": [ip], "failed": {ip: why},
"missing": [ip]}; exit 0 when at least one peer got the whole stream, 1 otherwise.
"""
import hashlib
import json
import socket
import sys
import time

CHUNK = 1 << 20
STALL_S = 120.0


def accept_peers(srv, peers, wait):
    conns = {}
    deadline = time.monotonic() + wait
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


def main(argv):
    ip, port, peers, wait = argv[0], int(argv[1]), set(argv[2].split(",")), float(argv[3])
    srv = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((ip, port))
    srv.listen(len(peers) + 8)
    try:
        conns = accept_peers(srv, peers, wait)
    finally:
        srv.close()
    missing = sorted(peers - set(conns))
    digest, sent, failed = hashlib.sha256(), 0, {}
    t = time.monotonic()
    src = sys.stdin.buffer
    while conns:
        chunk = src.read1(CHUNK) if hasattr(src, "read1") else src.read(CHUNK)
        if not chunk:
            break
        digest.update(chunk)
        sent += len(chunk)
        for peer, c in list(conns.items()):
            try:
                c.sendall(chunk)
            except OSError as exc:
                failed[peer] = f"{type(exc).__name__}: {exc}"
                conns.pop(peer).close()
    served = []
    for peer, c in conns.items():
        try:
            c.shutdown(socket.SHUT_WR)
            served.append(peer)
        except OSError as exc:
            failed[peer] = f"{type(exc).__name__}: {exc}"
        c.close()
    print(json.dumps({"bytes": sent, "sha256": digest.hexdigest(), "seconds": round(time.monotonic() - t, 2),
                      "served": sorted(served), "failed": failed, "missing": missing}), flush=True)
    return 0 if served else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
