"""Can this node reach HOST:PORT over TCP? Runs inside a node's container (fed on stdin).

Prints one JSON line {"ok": bool, "target": "HOST:PORT", "ms": float, "error": str|null};
exit 0 when reachable, 1 otherwise.
"""
import json
import socket
import sys
import time


def main(argv):
    host, port, timeout = argv[0], int(argv[1]), float(argv[2]) if len(argv) > 2 else 3.0
    t = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
        err = None
    except OSError as exc:
        err = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"ok": err is None, "target": f"{host}:{port}",
                      "ms": round((time.monotonic() - t) * 1000, 1), "error": err}), flush=True)
    return 0 if err is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
