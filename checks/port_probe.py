"""Can the nodes open TCP connections to each other on the ports the cluster will use? Runs on the
HOST (not in a container: `up` runs it before any container starts), fed on stdin to python3, in two
steps the controller runs on every node at once:

  port_probe.py listen IP SECONDS PORT...
      Binds each PORT on IP (0: an ephemeral port, as NCCL, Gloo and Ray's workers use), prints one
      JSON line {"ports": {"PORT": bound port | "busy" | "error: ..."}, "pid": the listener's pid | null}
      and returns at once, leaving that detached child to accept (and close) connections until it is
      killed (the controller kills it after the connect step, so the ports are free for the cluster at
      once) or SECONDS passed. It does not stop after as many connections as there are peers: others
      than the probe dial these ports too (the Ray workers of a head that died reconnect to its GCS
      port from the very peers' addresses), and a listener that counted them closed the port before
      the probe came. A busy port is not listened on (whatever holds it answers).
      It also binds a UDP port on IP (its number is the line's "udp", null when it could not) and answers
      each datagram there with its length: the payload probe's echo.
  port_probe.py connect SECONDS TARGET...
      Connects to every target at once, each within SECONDS, and prints one JSON line
      {"results": [{"target": "IP:PORT", "ok": bool, "ms": float, "error": null | "timeout" | "refused" | "..."}]}
      A target udp/SIZE/IP:PORT sends a SIZE-byte UDP datagram that may not be fragmented (DF set, as
      NCCL's and Gloo's full-size TCP segments are) to a listener's UDP port, up to 3 times, and is ok
      when the echo of its length came back: a datagram of the path's MTU that never arrives is a path
      that drops jumbo frames (a switch port left at 1500), where TCP connects and then hangs.

Standard library only; exit 0 whenever the line was printed.
"""
import json
import os
import select
import socket
import sys
import threading
import time


def listen(ip, seconds, ports):
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    socks, out = [], {}
    for p in ports:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, p))
            s.listen(64)
        except OSError as exc:
            s.close()
            out[str(p)] = "busy" if exc.errno == 98 else f"error: {exc}"
            continue
        out[str(p)] = s.getsockname()[1]
        socks.append(s)
    udp = socket.socket(family, socket.SOCK_DGRAM)
    try:
        udp.bind((ip, 0))
    except OSError:
        udp.close()
        udp = None
    if udp is not None:
        socks.append(udp)
    pid = os.fork() if socks else 0
    if pid or not socks:
        print(json.dumps({"ports": out, "udp": udp.getsockname()[1] if udp else None, "pid": pid or None}),
              flush=True)
        return 0
    # the child: detached from the SSH channel, so the command returns while it listens
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ready, _, _ = select.select(socks, [], [], max(0.0, end - time.monotonic()))
        for s in ready:
            try:
                if s is udp:
                    data, peer = s.recvfrom(65535)
                    s.sendto(str(len(data)).encode(), peer)
                else:
                    s.accept()[0].close()
            except OSError:
                continue
    os._exit(0)


#: Linux's IP_MTU_DISCOVER / IPV6_MTU_DISCOVER and their "do": never fragment (Python may not name them)
_DF = {socket.AF_INET: (socket.IPPROTO_IP, getattr(socket, "IP_MTU_DISCOVER", 10), 2),
       socket.AF_INET6: (socket.IPPROTO_IPV6, getattr(socket, "IPV6_MTU_DISCOVER", 23), 2)}


def _datagram(target, seconds):
    """udp/SIZE/IP:PORT: None when the echo came back, else why not."""
    _, size, hostport = target.split("/", 2)
    host, _, port = hostport.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.setsockopt(*_DF[family])
        except OSError:
            pass
        end = time.monotonic() + seconds
        for _ in range(3):
            try:
                s.sendto(b"\0" * int(size), (host, int(port)))
            except OSError as exc:
                return f"{type(exc).__name__}: {exc}"
            s.settimeout(max(0.05, min(seconds / 3, end - time.monotonic())))
            try:
                if s.recv(64).strip() == size.encode():
                    return None
            except socket.timeout:
                continue
            except OSError as exc:
                return f"{type(exc).__name__}: {exc}"
    return "timeout"


def _one(target, seconds, results, i):
    if target.startswith("udp/"):
        t = time.monotonic()
        err = _datagram(target, seconds)
        results[i] = {"target": target, "ok": err is None, "ms": round((time.monotonic() - t) * 1000, 1),
                      "error": err}
        return
    host, _, port = target.rpartition(":")
    host = host.strip("[]")
    t = time.monotonic()
    err = None
    try:
        with socket.create_connection((host, int(port)), timeout=seconds):
            pass
    except socket.timeout:
        err = "timeout"
    except ConnectionRefusedError:
        err = "refused"
    except OSError as exc:
        err = f"{type(exc).__name__}: {exc}"
    results[i] = {"target": target, "ok": err is None, "ms": round((time.monotonic() - t) * 1000, 1), "error": err}


def connect(seconds, targets):
    results = [None] * len(targets)
    threads = [threading.Thread(target=_one, args=(t, seconds, results, i), daemon=True)
               for i, t in enumerate(targets)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(seconds + 2)
    print(json.dumps({"results": [r or {"target": t, "ok": False, "ms": None, "error": "timeout"}
                                  for r, t in zip(results, targets)]}), flush=True)
    return 0


def main(argv):
    if argv[:1] == ["listen"]:
        return listen(argv[1], float(argv[2]), [int(p) for p in argv[3:]])
    if argv[:1] == ["connect"]:
        return connect(float(argv[1]), argv[2:])
    print(json.dumps({"error": "usage: port_probe.py listen|connect ..."}))
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
