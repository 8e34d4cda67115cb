"""What `serve` leaves in the node containers and how other commands read it: the files on the head
(log, pid, the plan it launched), stopping what it started, what is served now (`status`), and the
model's config as vLLM will read it (`serve` and the fleet both plan from it)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping

from bootstrap.cluster import facts as F
from bootstrap.errors import CommandFailed
from bootstrap.model import Host
from bootstrap.remote import docker as DK
from bootstrap.remote import node as N
from bootstrap.remote.session import Session, last_json
from bootstrap.serve import flags as FG
from bootstrap.serve import kvlog as KL

LOG = "/tmp/bootstrap-vllm-serve.log"
PIDFILE = "/tmp/bootstrap-vllm-serve.pid"
#: What serve launched (plan as JSON), on the head; `status` reads it, its age is the uptime.
STATE = "/tmp/bootstrap-vllm-serve.json"
#: `sh -c STOP`: stop what serve started: TERM the server, give it time to stop its workers, then
#: KILL leftovers (vLLM's engine processes; never Ray's own processes).
STOP = (f'p=$(cat {PIDFILE} 2>/dev/null); [ -n "$p" ] && kill -TERM "$p" 2>/dev/null; '
        f'for i in $(seq 1 40); do [ -n "$p" ] && kill -0 "$p" 2>/dev/null || break; sleep 0.25; done; '
        + DK.kill_matching('*"vllm serve"*|VLLM::*|*"vllm.entrypoints"*') + f'; rm -f {PIDFILE} {STATE}')


@dataclass(frozen=True)
class ServingState:
    """What is served on the cluster now, from the head (the state serve left and a live probe)."""
    model: str
    served: list[str]
    backend: str
    tp: int
    pp: int
    endpoint: str
    #: "healthy" (/health answered 200), "starting" (process up, no answer yet), or "down: why"
    health: str
    uptime_s: float | None
    kv: KL.KvCapacity | None
    nodes: list[str]
    split_reason: str = ""
    #: data parallel engines (1: one engine)
    dp: int = 1
    #: requests finished per engine index (from the API server's /metrics; None: not read)
    engines: dict[str, float] | None = None
    #: ranks the experts are spread over (expert parallel; 1: none) and its all-to-all backend
    ep: int = 1
    all2all: str | None = None

    def to_dict(self) -> dict:
        return {"model": self.model, "served": self.served, "backend": self.backend, "tp": self.tp, "pp": self.pp,
                "dp": self.dp, "endpoint": self.endpoint, "health": self.health, "uptime_s": self.uptime_s,
                "kv_cache_tokens": self.kv.tokens if self.kv else None, "nodes": self.nodes,
                "split_reason": self.split_reason, "engines": self.engines, "ep": self.ep, "all2all": self.all2all}


def parse_serving(probe: dict) -> ServingState | None:
    """The serve_state.py payload's answer as a ServingState (None: nothing was served)."""
    st = probe.get("state") if isinstance(probe, dict) else None
    if not probe.get("serving") or not isinstance(st, dict):
        return None
    health = probe.get("health")
    if health == "ok":
        word = "healthy"
    elif probe.get("process"):
        word = f"starting ({health})" if health else "starting"
    else:
        word = f"down: the vLLM server process has exited{f' ({health})' if health else ''}"
    kv = KL.kv_capacity("\n".join(probe.get("kv_lines") or []))
    return ServingState(str(st.get("model", "?")), list(probe.get("models") or []), str(st.get("backend", "?")),
                        int(st.get("tp") or 0), int(st.get("pp") or 0), str(st.get("endpoint", "")), word,
                        probe.get("uptime_s"), kv, [str(n) for n in st.get("nodes") or []],
                        str(st.get("split_reason") or ""), int(st.get("dp") or 1), engine_counts(probe.get("engines")),
                        _int(st.get("ep"), 1), st.get("all2all") if isinstance(st.get("all2all"), str) else None)


def _int(v: object, default: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else default


def engine_counts(got: object) -> dict[str, float] | None:
    """A probe's {engine index: requests finished} (None: not read, or no engine label)."""
    if not isinstance(got, dict) or not got:
        return None
    return {str(k): float(v) for k, v in got.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def stop_serving(sess: Session, h: Host) -> None:
    """STOP in the host's node container (serve and the fleet both). A container that is absent
    or stopped serves nothing: done. Any other failure (Docker does not answer, the exec is refused)
    raises CommandFailed naming the host: `serve --stop` must not say "stopped" where vLLM may still run."""
    name = sess.inv.cluster.container_name
    r = N.of(sess, h, name).run_in("sh", "-c", STOP, timeout=60, check=False)
    if not r.ok and not DK.not_running_only(r):
        raise CommandFailed(h.name, f"docker exec {name} sh -c <stop what serve started>", r.exit_code,
                            (r.stderr or r.stdout)[-2000:])


def serving_state(sess: Session) -> ServingState | None:
    """Ask the head container what serve left running (one payload, one SSH round trip)."""
    inv = sess.inv
    name = inv.cluster.container_name
    # no answer (docker exec failed, no Python there) raises PayloadFailed: unknown, not "nothing served"
    return parse_serving(N.of(sess, inv.head, name).payload("serve_state.py", STATE, PIDFILE, LOG, timeout=30))


#: The image's `vllm serve` options, remembered on the host per image ID (a content hash) next to
#: `up`'s markers: reading them imports vLLM (seconds).
_OPTIONS_CACHED = ('id=$(docker image inspect --format "{{.Id}}" "$1") || exit 3; id=${id#sha256:}; '
                   'echo "id=$id"; f="' + F.MARKER_DIR + '/vllm-options-$id.json"; [ -s "$f" ] && cat "$f"; exit 0')
_OPTIONS_SAVE = 'mkdir -p "' + F.MARKER_DIR + '" && cat > "' + F.MARKER_DIR + '/.vllm-options-$1.new" && ' \
                'mv -f "' + F.MARKER_DIR + '/.vllm-options-$1.new" "' + F.MARKER_DIR + '/vllm-options-$1.json"'


def read_vllm_options(sess: Session, host: Host, image: str) -> tuple[FG.VllmOptions | None, str]:
    """(what the image's `vllm serve` takes, "" or why it is not known): from the host's cache for
    this image ID, else read in a throw-away container of the image (checks/vllm_options.py) and
    cached. Unknown (no answer, an old layout) is not an error: the caller says so and keeps the
    checks it has without it."""
    node = N.of(sess, host)
    s = node.ssh

    def read(h: Host) -> tuple[FG.VllmOptions | None, str]:
        r = s.run(("sh", "-c", _OPTIONS_CACHED, "sh", image), timeout=30, check=False, query=True)
        if not r.ok:
            return None, f"no image {image} on {host.name}"
        head, _, body = r.stdout.partition("\n")
        image_id = "".join(c for c in head.removeprefix("id=") if c.isascii() and c.isalnum())
        cached = FG.VllmOptions.from_doc(last_json(body)) if body.strip() else None
        if cached is not None:
            return cached, ""
        asked = node.ask_image(image, "vllm_options.py", timeout=240)
        out, doc = asked.result, asked.doc
        opts = FG.VllmOptions.from_doc(doc)
        if opts is None:
            why = doc.get("error") if isinstance(doc, dict) and doc.get("error") else (out.stderr or out.stdout)[-200:]
            return None, f"could not read the options of {image}'s vLLM ({' '.join(str(why).split())})"
        if image_id:
            s.run_with_input(("sh", "-c", _OPTIONS_SAVE, "sh", image_id), [json.dumps(opts.to_doc()).encode()],
                             timeout=30, check=False)
        return opts, ""

    return sess.stage("vllm-options", [host], read)[host.name]


def check_extra_in_image(sess: Session, host: Host, image: str, extra, backend: str | None,
                         notes: list[str], plan_sets: Mapping[str, str] | None = None) -> None:
    """The words after `--` read as the image's vLLM will read them (plan.check_extra_against; plan_sets:
    the flags a fleet's plan sets beyond serve's), before anything is changed; where the image's options
    cannot be read, a note says the words were checked against bootstrap's own list only."""
    if not extra:
        return
    opts, why = read_vllm_options(sess, host, image)
    if opts is None:
        notes.append(f"{why}: the options after -- were checked against bootstrap's own list only")
        return
    FG.check_extra_against(extra, opts, backend, plan_sets)


def read_model_info(sess: Session, host: Host, model: str) -> dict:
    """The model's config.json (and safetensors index), read in the host's node container, where
    vLLM reads them: {"config", "index", "source", "error"}."""
    name = sess.inv.cluster.container_name
    got = sess.stage("model-config", [host], lambda h: N.of(sess, h, name).payload_or_error(
        "model_info.py", model, timeout=90))
    return got[host.name]
