"""Forward this host's 127.0.0.1:PORT to the head's registry mirror while a command runs. Run on a
node's host by bootstrap over SSH during a cold `up` (bootstrap/cluster/imagedist/): Docker pulls
from a registry on loopback over plain HTTP with no daemon setting, so the node pulls
127.0.0.1:PORT/REPO:TAG and this passes every connection on to HEAD_IP:PORT, connecting from the
node's data-plane IP (the mirror serves the cluster's members only).

argv: PORT HEAD_IP SRC_IP COMMAND...
Exit: the command's exit status; 3 when 127.0.0.1:PORT is taken (nothing is run then).
"""
import socket
import subprocess
import sys
import threading

CHUNK = 1 << 20


def pump(src, dst):
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def handle(client, head, port, src):
    try:
        family = socket.AF_INET6 if ":" in head else socket.AF_INET
        up = socket.socket(family, socket.SOCK_STREAM)
        up.bind((src, 0))
        up.settimeout(30)
        up.connect((head, port))
        up.settimeout(None)
    except OSError as exc:
        print(f"mirror_forward: cannot reach the mirror at {head}:{port} from {src}: {exc}", file=sys.stderr)
        client.close()
        return
    back = threading.Thread(target=pump, args=(up, client), daemon=True)
    back.start()
    pump(client, up)
    back.join()
    client.close()
    up.close()


def main(argv):
    port, head, src, cmd = int(argv[0]), argv[1], argv[2], argv[3:]
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        srv.bind(("127.0.0.1", port))
    except OSError as exc:
        print(f"mirror_forward: 127.0.0.1:{port} is taken on this host ({exc.strerror}): "
              "set cluster.ports.image_copy to a free port", file=sys.stderr)
        return 3
    srv.listen(64)

    def accept():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(c, head, port, src), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    rc = subprocess.call(cmd)
    srv.close()
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
