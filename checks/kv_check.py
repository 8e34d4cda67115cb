"""KV transfer check: can a decode node read a prefill node's KV buffer over NIXL, as vLLM's
NixlConnector does, before a disaggregated fleet is served?

Runs INSIDE the cluster container of a prefill head (the source) and of a decode head (the
reader), both at once, started by the controller (bootstrap/fleet/kvcheck.py):

    python3 kv_check.py source --ip PREFILL_IP --port PORT [--device cpu|cuda] [--mib N] [--blocks B]
                               [--timeout SECONDS] [--env UCX_NET_DEVICES=mlx5_0:1 ...]
    python3 kv_check.py reader --ip DECODE_IP --peer PREFILL_IP --port PORT [--rounds R] [same options]

The steps are those of vLLM's NixlConnector (kv_connector/v1/nixl): each side makes a NIXL agent
with the UCX backend (4 threads, vLLM's default) and registers its KV buffer (host memory on CPU
nodes, GPU memory on GPU nodes: vLLM's kv_buffer_device); the two exchange agent metadata and
the source's block descriptors over a TCP side channel (the source listens on its data-plane IP
and the fleet's KV side-channel port); the reader READs every block of the source's buffer (decode pulls from
prefill), with a notification the source must receive (vLLM frees prefill blocks on it), and
checks every byte. The first read includes UCX's connection set-up; the rounds after it are timed.
--env sets the variables the fleet's members get (UCX_NET_DEVICES from the node's InfiniBand
facts) before NIXL is loaded, so the check runs on the same devices the KV cache will.

Output: one JSON object per line on stdout.
  each phase (import, buffer, agent, exchange, transfer, verify, notify):
    {"event": "phase", "phase": NAME, "ok": bool, "role": "source"|"reader", "t": seconds, "error": ...}
  the reader, last: {"event": "result", "ok", "role", "device", "bytes", "blocks", "rounds",
                     "first_s", "best_s", "GBps", "nixl", "backend"}
  the source, last: {"event": "result", "ok", "role", "notified": bool, "reader": {...the reader's result}}
Exit status 0 when every phase passed, 1 otherwise; nothing blocks longer than --timeout.

Stdlib, torch and nixl only.
"""
import argparse
import json
import os
import socket
import struct
import sys
import time
import uuid

T0 = time.monotonic()
TAG = b"bootstrap-kvcheck"
MIB = 1 << 20
#: How long the source waits for the notification once the reader has reported its reads.
NOTIFY_WAIT_S = 10.0
#: The source waits this much longer than the reader tries to connect (the reader may start later).
ACCEPT_MARGIN_S = 10.0


def emit(obj):
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


class Failed(Exception):
    def __init__(self, phase, error):
        super().__init__(error)
        self.phase = phase


def phase(args, step, **extra):
    emit({"event": "phase", "phase": step, "ok": True, "role": args.role,
          "t": round(time.monotonic() - T0, 3), "error": None, **extra})


def left(args):
    return args.deadline - time.monotonic()


def send_msg(sock, payload):
    sock.sendall(struct.pack("!I", len(payload)) + payload)


def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the other side closed the side channel")
        data += chunk
    return data


def recv_msg(sock):
    (n,) = struct.unpack("!I", recv_exact(sock, 4))
    return recv_exact(sock, n)


def pattern(torch, nbytes, device, seed):
    """A buffer whose every byte depends on its offset and the seed (a copy of the wrong block, a
    short read or zeros all differ from it)."""
    base = (torch.arange(MIB, dtype=torch.int32) * 131 + seed) % 251
    reps = -(-nbytes // MIB)
    return base.to(torch.uint8).repeat(reps)[:nbytes].to(device)


def make_agent(args, torch):
    try:
        from nixl._api import nixl_agent, nixl_agent_config
    except Exception as e:  # ImportError, or nixl's own "detected CUDA 13 but nixl-cu13 is not installed"
        raise Failed("import", f"{type(e).__name__}: {e}") from e
    import nixl
    phase(args, "import", nixl=getattr(nixl, "__version__", None) or _dist_version("nixl"))
    device = "cuda" if args.device == "cuda" else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise Failed("buffer", "--device cuda but CUDA is not available in this container")
    try:
        buf = (pattern(torch, args.mib * MIB, device, args.seed) if args.role == "source"
               else torch.zeros(args.mib * MIB, dtype=torch.uint8, device=device))
    except Exception as e:
        raise Failed("buffer", f"{type(e).__name__}: {e}") from e
    phase(args, "buffer", device=device, bytes=buf.numel())
    try:
        config = nixl_agent_config(backends=["UCX"], num_threads=args.threads)
        agent = nixl_agent(f"kvcheck-{args.role}-{uuid.uuid4().hex[:8]}", config)
        if "UCX" not in agent.backends:
            raise RuntimeError(f"no UCX backend (plugins: {', '.join(agent.get_plugin_list()) or 'none'})")
        agent.register_memory(buf)
        blocks = list(buf.chunk(args.blocks))
        descs = agent.get_xfer_descs(blocks)
    except Exception as e:
        raise Failed("agent", f"{type(e).__name__}: {e}") from e
    phase(args, "agent", agent=agent.name)
    return agent, buf, descs


def agent_name(name):
    """NIXL's add_remote_agent gives the name as bytes."""
    return name.decode() if isinstance(name, bytes) else name


def _dist_version(name):
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return None


def wait_notified(args, agent, remote):
    while left(args) > 0:
        if agent.check_remote_xfer_done(remote, TAG):
            return True
        time.sleep(0.01)
    return False


def run_source(args, torch):
    try:  # listening before the agent is made: the reader's connect succeeds as soon as this side runs
        srv = socket.create_server((args.ip, args.port), reuse_port=False)
    except OSError as e:
        raise Failed("exchange", f"{type(e).__name__}: {e} (listening on {args.ip}:{args.port})") from e
    agent, buf, descs = make_agent(args, torch)
    try:
        srv.settimeout(max(min(left(args), args.connect_timeout + ACCEPT_MARGIN_S), 0.1))
        conn, _ = srv.accept()
        conn.settimeout(max(left(args), 0.1))
        remote = agent_name(agent.add_remote_agent(recv_msg(conn)))
        send_msg(conn, agent.get_agent_metadata())
        send_msg(conn, agent.get_serialized_descs(descs))
    except (OSError, ConnectionError) as e:
        raise Failed("exchange", f"{type(e).__name__}: {e} (listening on {args.ip}:{args.port})") from e
    phase(args, "exchange", peer=remote)
    try:
        reader = json.loads(recv_msg(conn))
    except (OSError, ConnectionError, ValueError) as e:
        raise Failed("exchange", f"no result from the reader: {type(e).__name__}: {e}") from e
    if not reader.get("ok"):
        raise Failed("transfer", f"the reader failed: {reader.get('error')}")
    args.deadline = min(args.deadline, time.monotonic() + NOTIFY_WAIT_S)
    if not wait_notified(args, agent, remote):
        raise Failed("notify", "the reader's transfer notification never arrived (vLLM frees prefill blocks on it)")
    phase(args, "notify")
    emit({"event": "result", "ok": True, "role": "source", "notified": True, "reader": reader})
    return True


def connect(args):
    last = None
    until = time.monotonic() + args.connect_timeout
    while left(args) > 0 and time.monotonic() < until:
        try:
            sock = socket.create_connection((args.peer, args.port), timeout=min(5.0, max(left(args), 0.1)),
                                            source_address=(args.ip, 0))
            sock.settimeout(max(left(args), 0.1))
            return sock
        except OSError as e:  # the source may not listen yet
            last = e
            time.sleep(0.2)
    raise Failed("exchange", f"could not reach the prefill side {args.peer}:{args.port} "
                             f"in {args.connect_timeout:.0f} s: {last}")


def read_once(args, agent, handle):
    state = agent.transfer(handle)
    while state == "PROC" and left(args) > 0:
        state = agent.check_xfer_state(handle)
    if state != "DONE":
        raise Failed("transfer", "the transfer timed out" if state == "PROC" else f"NIXL reported {state}")


def run_reader(args, torch):
    agent, buf, descs = make_agent(args, torch)
    sock = connect(args)
    try:
        send_msg(sock, agent.get_agent_metadata())
        remote = agent_name(agent.add_remote_agent(recv_msg(sock)))
        remote_descs = agent.deserialize_descs(recv_msg(sock))
    except (OSError, ConnectionError) as e:
        raise Failed("exchange", f"{type(e).__name__}: {e}") from e
    phase(args, "exchange", peer=remote)
    result = {"event": "result", "ok": False, "role": "reader", "device": buf.device.type, "bytes": buf.numel(),
              "blocks": args.blocks, "rounds": args.rounds}
    try:
        try:
            handle = agent.initialize_xfer("READ", descs, remote_descs, remote, TAG)
            backend = agent.query_xfer_backend(handle)
            t = time.monotonic()
            read_once(args, agent, handle)
            if buf.device.type == "cuda":
                torch.cuda.synchronize()
            first = time.monotonic() - t
            times = []
            for _ in range(args.rounds):
                t = time.monotonic()
                read_once(args, agent, handle)
                times.append(time.monotonic() - t)
        except Failed:
            raise
        except Exception as e:
            raise Failed("transfer", f"{type(e).__name__}: {e}") from e
        best = min(times) if times else first
        phase(args, "transfer", first_s=round(first, 4), best_s=round(best, 4))
        if not torch.equal(buf, pattern(torch, buf.numel(), buf.device, args.seed)):
            bad = (buf != pattern(torch, buf.numel(), buf.device, args.seed)).nonzero()
            raise Failed("verify", f"the bytes read differ from the prefill side's from offset {int(bad[0])}")
        phase(args, "verify")
        result.update(ok=True, first_s=round(first, 4), best_s=round(best, 6),
                      GBps=round(buf.numel() / best / 1e9, 3) if best > 0 else None,
                      nixl=_dist_version("nixl"), backend=backend)
    except Failed as f:
        result["error"] = f"{f.phase}: {f}"
        send_msg(sock, json.dumps(result).encode())
        raise
    send_msg(sock, json.dumps(result).encode())
    emit(result)
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("role", choices=("source", "reader"))
    ap.add_argument("--ip", required=True, help="this node's data-plane IP (the side channel binds to it)")
    ap.add_argument("--peer", help="the source's IP (reader)")
    ap.add_argument("--port", type=int, required=True, help="the side channel's TCP port on the source")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4, help="UCX threads (vLLM's NixlConnector default: 4)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds for everything, imports included")
    ap.add_argument("--connect-timeout", type=float, default=20.0,
                    help="seconds the reader tries to reach the source (the source waits 10 s more)")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    args = ap.parse_args(argv)
    if args.role == "reader" and not args.peer:
        ap.error("reader needs --peer")
    args.deadline = T0 + args.timeout
    for item in args.env:
        name, _, value = item.partition("=")
        os.environ[name] = value
    try:
        try:
            import torch
        except Exception as e:
            raise Failed("import", f"{type(e).__name__}: {e}") from e
        ok = (run_source if args.role == "source" else run_reader)(args, torch)
    except Failed as f:
        return failed(args, f.phase, str(f))
    except Exception as e:  # a defect here or in NIXL's bindings: one line too, not a traceback alone
        import traceback
        traceback.print_exc(file=sys.stderr)
        return failed(args, "internal", f"{type(e).__name__}: {e}")
    return 0 if ok else 1


def failed(args, step, error):
    emit({"event": "phase", "phase": step, "ok": False, "role": args.role,
          "t": round(time.monotonic() - T0, 3), "error": error})
    emit({"event": "result", "ok": False, "role": args.role, "error": f"{step}: {error}"})
    return 1


if __name__ == "__main__":
    sys.exit(main())
