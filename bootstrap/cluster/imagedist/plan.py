"""Image distribution's decisions and commands (pure): who copies the image to whom, and the registry mirror.

Peer copies: the image crosses the registry once; nodes that have it serve it to the nodes that lack
it. The controller starts both ends over SSH (no node-to-node SSH trust): the sender runs `docker
save IMAGE` into a throw-away container of the image (checks/image_seed.py) listening on its
data-plane IP for exactly the receivers' addresses; each receiver connects with bash's /dev/tcp and
pipes the stream into `docker load`. The receiver's image ID must then equal the sender's: an image
ID is the digest of the image's config, which lists the digest of every layer, and `docker load`
checks each layer against it, so equal IDs mean equal content.

The registry mirror of a cold `up`: when no node has the image, the head runs nginx as a caching
proxy of the image's registry (``cluster.image_mirror``, the container's image) and every node pulls
at once through it: the head from ``127.0.0.1:PORT``, the others from their own ``127.0.0.1:PORT``,
which checks/mirror_forward.py forwards to the head's data-plane IP (Docker speaks plain HTTP to a
registry on loopback without any daemon setting, and the nodes' Docker needs no trust in the head).
nginx fetches each layer from the registry once, in slices, and the nodes that ask for a slice
already being fetched wait for it and read it from the cache: the registry sends the image once, and
every node unpacks each layer while the next ones arrive, as one pull does.

The I/O is in run.py. See docs/image-distribution.md.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from bootstrap.cluster import plan as PL
from bootstrap.model import Host
from bootstrap.remote import argv as RA

# -- which hosts get the image, and which send it ---------------------------------------------------


def lacking(hosts: Sequence[Host], ids: Mapping[str, str | None], want_id: str | None, *,
            pull: bool) -> list[Host]:
    """The hosts to get the image (``ids``: each host's image ID, None where it has none): with
    ``want_id`` (the image streamed from this machine) those that hold another; else those without it,
    or all of them with ``pull``."""
    if want_id is not None:
        return [h for h in hosts if ids[h.name] != want_id]
    return [h for h in hosts if pull or ids[h.name] is None]


def first_of(hosts: Sequence[Host]) -> Host:
    """The head when it is among ``hosts``, else the first of them: the host that gets the image first."""
    return next((h for h in hosts if h.is_head), hosts[0])


def seeds_of(have: Sequence[Host], ids: Mapping[str, str | None],
             want_id: str | None) -> tuple[list[Host], str | None]:
    """The hosts of ``have`` that can send the image to the others, and its ID: ``want_id``, or (None)
    the tag as the head has it when it has it, else as the first of ``have`` has it."""
    if want_id is None and have:
        want_id = ids[first_of(have).name]
    return [h for h in have if ids[h.name] == want_id], want_id


# -- peer copies between nodes --------------------------------------------------------------------

#: receivers one sender serves at once (one `docker save` read, copied to each)
FANOUT = 4
#: children per node of a model directory's pipelined copy: 1, a chain (every link carries the
#: stream once, at once; measured in perf/cold_up.py --sync-only --fanouts 1,4)
MODEL_FANOUT = 1
#: how long a sender waits for its receivers to connect, and receivers keep trying
CONNECT_WAIT_S = 60.0
SEED_CONTAINER = "bootstrap-image-seed"
#: bash exit status when the receiver never reached the sender
NO_SENDER = 111


@dataclass(frozen=True)
class Transfer:
    sender: str
    receivers: tuple[str, ...]


def copy_rounds(seeds: Sequence[str], receivers: Sequence[str], fanout: int = FANOUT) -> list[list[Transfer]]:
    """Rounds of transfers: in each, every node that has the image serves up to ``fanout`` of the
    nodes that lack it, which serve in the next round (a tree: log_(fanout+1) N rounds)."""
    if not seeds and receivers:
        raise ValueError("no node has the image to send")
    have, todo, rounds = list(seeds), list(receivers), []
    while todo:
        this: list[Transfer] = []
        for s in have:
            if not todo:
                break
            got, todo = todo[:fanout], todo[fanout:]
            this.append(Transfer(s, tuple(got)))
        rounds.append(this)
        have += [r for t in this for r in t.receivers]
    return rounds


def tree_children(receivers: int, fanout: int = 1) -> dict[int, list[int]]:
    """A pipelined copy's shape over positions 0 (the root) .. ``receivers``: each position's
    children, in order (position p feeds p*fanout+1 .. p*fanout+fanout). fanout 1 is a chain."""
    if fanout < 1:
        raise ValueError("fanout must be at least 1")
    kids: dict[int, list[int]] = {}
    for c in range(1, receivers + 1):
        kids.setdefault((c - 1) // fanout, []).append(c)
    return kids


def seed_argv(image: str, bind_ip: str, port: int, peer_ips: Sequence[str], script: str,
              wait_s: float = CONNECT_WAIT_S) -> tuple[str, ...]:
    """On the sender: `docker save IMAGE` into a container of the image that serves the stream
    (checks/image_seed.py). The container has no capabilities, no writable root, runs as nobody, on
    the host network only to bind the data-plane IP."""
    run = ("docker run -i --rm --name " + SEED_CONTAINER + " --network host --cap-drop ALL "
           "--security-opt no-new-privileges --read-only --user 65534:65534 --pull never "
           '--label bootstrap.role=image-seed --entrypoint python3 "$1" -c "$2" "$3" "$4" "$5" "$6"')
    sh = f'docker rm -f {SEED_CONTAINER} >/dev/null 2>&1; docker save "$1" | {run}'
    return ("sh", "-c", sh, "sh", image, script, bind_ip, str(port), ",".join(peer_ips), f"{wait_s:g}")


def receive_argv(sender_ip: str, port: int, wait_s: float = CONNECT_WAIT_S) -> tuple[str, ...]:
    """On a receiver: connect to the sender (retrying while it starts) and pipe the stream into
    `docker load`."""
    w = max(1, round(wait_s))
    # Bounded by bash's clock (SECONDS), not a count of tries: a refused connect can take a second.
    # A connect whose SYN is dropped blocks for minutes (the kernel's SYN retries): a watchdog
    # signals the shell 2 s after the wait, which ends that connect too; it is killed (with its sleep)
    # once connected. It holds none of the shell's output: the SSH channel closes when the copy ends.
    script = (f'( trap \'kill $! 2>/dev/null; exit 0\' TERM; sleep {w + 2} & wait $!; kill $$ ) '
              f'>/dev/null 2>&1 </dev/null & dog=$!; exec 4>&2; '
              f'trap \'echo "nothing answers on $0:$1 (no reply to the connect in {w + 2}s)" >&4; '
              f'exit {NO_SENDER}\' TERM; '
              f'until exec 3<"/dev/tcp/$0/$1"; do [ "$SECONDS" -ge {w} ] && break; '
              f'sleep 0.5; done 2>/dev/null; kill "$dog" 2>/dev/null; trap - TERM; exec 4>&-; '
              f'if ! {{ true <&3; }} 2>/dev/null; then '
              f'echo "nothing listens on $0:$1" >&2; exit {NO_SENDER}; fi; docker load <&3')
    host = sender_ip.strip("[]")
    return ("bash", "-c", script, host, str(port))


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


# -- the registry mirror on the head ----------------------------------------------------------------

CONTAINER = "bootstrap-image-mirror"
VOLUME = "bootstrap-image-mirror"
#: what nginx fetches from the registry at a time; a node asking for a slice being fetched waits
#: for that slice only
SLICE = "8m"
#: Docker Hub's registry, for images without a registry in their name
DOCKER_HUB = "registry-1.docker.io"
#: registry hosts Docker talks plain HTTP to without being told
_LOOPBACK = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class ImageRef:
    """An image reference split as Docker reads it (github.com/distribution/reference)."""

    registry: str  # host[:port]; DOCKER_HUB for Docker Hub
    path: str  # the repository inside it (library/NAME for Docker Hub's official images)
    tag: str | None
    digest: str | None


def split_image(image: str) -> ImageRef:
    """``image`` (already checked by the inventory) split into registry, repository, tag, digest."""
    rest, _, digest = image.partition("@")
    first, slash, after = rest.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        registry, rest = first, after
    else:
        registry = DOCKER_HUB
        if "/" not in rest:
            rest = f"library/{rest}"
    path, _, tag = rest.partition(":")  # the registry is off: a colon here is the tag's
    if registry in ("docker.io", "index.docker.io"):
        registry = DOCKER_HUB
    return ImageRef(registry, path, tag or (None if digest else "latest"), digest or None)


def mirror_ref(image: str, port: int) -> str | None:
    """The name a node pulls the image by through the mirror: ``127.0.0.1:PORT/REPO:TAG``; None for
    an image pinned by digest (it cannot be tagged back under that name)."""
    ref = split_image(image)
    if ref.digest:
        return None
    return f"127.0.0.1:{port}/{ref.path}:{ref.tag}"


def registry_config_cmd() -> tuple[str, ...]:
    """`docker info`'s registry settings on the head (which registries it talks plain HTTP to)."""
    return RA.info_argv("{{json .RegistryConfig}}")


def plain_http(registry: str, registry_config: str) -> bool:
    """Whether the head's Docker talks plain HTTP to ``registry`` (listed in its insecure
    registries, or on loopback): then so does the mirror. Unreadable settings: TLS."""
    if registry.split(":")[0] in _LOOPBACK or registry.startswith("[::1]"):
        return True
    try:
        conf = json.loads(registry_config)
    except ValueError:
        return False
    entry = (conf.get("IndexConfigs") or {}).get(registry) if isinstance(conf, dict) else None
    return isinstance(entry, dict) and entry.get("Secure") is False


def nginx_conf(registry: str, https: bool, bind_ip: str, port: int, allow: Sequence[str]) -> str:
    """nginx's configuration: listens on 127.0.0.1 and the head's data-plane IP at ``port`` for the
    cluster's members only, answers GET and HEAD of the registry API (pulls, never pushes), caches
    blobs (content-addressed: a digest's bytes never change) in slices with one fetch per slice
    (``proxy_cache_lock``), and passes everything else (manifests by tag, auth) through uncached."""
    scheme = "https" if https else "http"
    tls = ""
    if https:
        name = registry.rsplit(":", 1)[0] if not registry.endswith("]") else registry
        tls = (f"    proxy_ssl_server_name on;\n    proxy_ssl_name {name};\n    proxy_ssl_verify on;\n"
               "    proxy_ssl_verify_depth 4;\n"
               "    proxy_ssl_trusted_certificate /etc/ssl/certs/ca-certificates.crt;\n")
    target = registry if ":" in registry.lstrip("[").split("]")[-1] else f"{registry}:{443 if https else 80}"
    allows = "".join(f"    allow {ip};\n" for ip in ("127.0.0.1", *allow))
    common = (f"      limit_except GET {{ deny all; }}\n"
              f"      proxy_http_version 1.1;\n"
              f"      proxy_set_header Connection \"\";\n"
              f"      proxy_set_header Host {registry};\n"
              f"      proxy_pass {scheme}://registry;\n")
    return (
        "worker_processes 2;\n"
        "pid /tmp/nginx.pid;\n"
        "error_log stderr warn;\n"
        "events { worker_connections 1024; }\n"
        "http {\n"
        "  access_log off;\n"
        "  client_body_temp_path /tmp/body;\n"
        "  proxy_temp_path /tmp/proxy;\n"
        "  fastcgi_temp_path /tmp/fastcgi;\n  uwsgi_temp_path /tmp/uwsgi;\n  scgi_temp_path /tmp/scgi;\n"
        "  proxy_cache_path /cache levels=1:2 keys_zone=blobs:16m max_size=1000g inactive=1d use_temp_path=off;\n"
        f"  upstream registry {{ server {target}; keepalive 16; }}\n"
        "  server {\n"
        f"    listen 127.0.0.1:{port};\n"
        f"    listen {PL.hostport(bind_ip, port)};\n"
        f"{allows}    deny all;\n"
        "    client_max_body_size 1k;\n"
        f"{tls}"
        '    location ~ "^/v2/.+/blobs/sha256:[0-9a-f]{64}$" {\n'
        f"      slice {SLICE};\n"
        "      proxy_cache blobs;\n"
        "      proxy_cache_key $uri$slice_range;\n"
        "      proxy_set_header Range $slice_range;\n"
        "      proxy_cache_valid 200 206 1d;\n"
        "      proxy_cache_lock on;\n"
        "      proxy_cache_lock_timeout 1h;\n"
        "      proxy_cache_lock_age 1h;\n"
        f"{common}"
        "    }\n"
        "    location /v2/ {\n"
        f"{common}"
        "    }\n"
        "    location / { return 404; }\n"
        "  }\n"
        "}\n"
    )


def prepare_argv(mirror_image: str) -> tuple[str, ...]:
    """On the head: a fresh cache volume, owned by the user nginx runs as (nobody), and no mirror
    left by an interrupted `up`."""
    run = RA.docker_argv(RA.RunSpec('"$1"', rm=True, options=("--pull", "never", "--network", "none", *RA.caps("CHOWN"),
                                                             *RA.volumes(f"{VOLUME}:/cache")),
                                    entrypoint="chown", command=("65534:65534", "/cache")))
    sh = (f"docker rm -f {CONTAINER} >/dev/null 2>&1; docker volume rm -f {VOLUME} >/dev/null 2>&1; "
          f"docker volume create --label bootstrap.role=image-mirror {VOLUME} >/dev/null && " + " ".join(run))
    return ("sh", "-c", sh, "sh", mirror_image)


def run_argv(mirror_image: str, conf: str) -> tuple[str, ...]:
    """On the head: nginx in a container on the host network (to bind the data-plane IP), as nobody,
    with no capabilities and a read-only root; the configuration written into its /tmp at start."""
    run = RA.docker_argv(RA.RunSpec(
        '"$1"', CONTAINER, detach=True,
        options=(*RA.labels({"bootstrap.role": "image-mirror"}), "--pull", "never", "--network", "host", *RA.hardened(),
                 "--read-only", "--tmpfs", "/tmp:size=64m", "--user", "65534:65534", *RA.volumes(f"{VOLUME}:/cache"),
                 *RA.env({"BOOTSTRAP_MIRROR_CONF": '"$2"'})),
        entrypoint="sh",
        command=("-c", """'printf "%s" "$BOOTSTRAP_MIRROR_CONF" >/tmp/nginx.conf && exec nginx -e stderr """
                       """-c /tmp/nginx.conf -g "daemon off;"'""")))
    return ("sh", "-c", " ".join(run) + " >/dev/null", "sh", mirror_image, conf)


def remove_argv() -> tuple[str, ...]:
    """On the head: the mirror and its cache gone (what `up` leaves behind is the image alone)."""
    return ("sh", "-c", f"docker rm -f {CONTAINER} >/dev/null 2>&1; docker volume rm -f {VOLUME} >/dev/null")


def probe_argv(port: int) -> tuple[str, ...]:
    """On the head: the status line of the registry API's root through the mirror (bash's /dev/tcp:
    nothing else needed on the host); retried while nginx starts."""
    script = ("for i in $(seq 50); do exec 3<>/dev/tcp/127.0.0.1/$0 2>/dev/null && break; sleep 0.1; done; "
              "printf 'GET /v2/ HTTP/1.0\\r\\nHost: mirror\\r\\n\\r\\n' >&3 && head -n 1 <&3")
    return ("bash", "-c", script, str(port))


_STATUS = re.compile(r"HTTP/\d(?:\.\d)? (\d{3})")


def probe_status(out: str) -> int | None:
    m = _STATUS.search(out)
    return int(m.group(1)) if m else None


def probe_why(status: int | None) -> str:
    """Why a mirror whose probe answered ``status`` (not 200) cannot serve, in words."""
    return {None: "it does not answer", 401: "the registry asks for credentials (the mirror serves "
            "registries that answer anonymously)"}.get(status, f"the registry answers it with HTTP {status}")


def pull_argv(ref: str, head_ip: str | None, port: int, src_ip: str, script: str) -> tuple[str, ...]:
    """On a node: `docker pull REF` through the mirror (on the head: its own 127.0.0.1; elsewhere
    checks/mirror_forward.py forwards 127.0.0.1:PORT to the head while the pull runs)."""
    if head_ip is None:
        return RA.pull_argv(ref)
    return ("python3", "-c", script, str(port), head_ip.strip("[]"), src_ip.strip("[]"), *RA.pull_argv(ref))


def retag_argv(ref: str, image: str) -> tuple[str, ...]:
    """On a node: the pulled image under the inventory's name, the mirror's name removed."""
    return ("sh", "-c", 'docker tag "$1" "$2" && docker image rm "$1" >/dev/null', "sh", ref, image)
