"""How Docker gives a container the GPUs on a host (pure: the facts command, its parser, the choice).

`docker run --gpus all` needs only the NVIDIA Container Toolkit's `nvidia-container-runtime-hook` on
the daemon's PATH (Docker 19.03+; a Docker runtime named `nvidia` is not needed); CDI (the Container
Device Interface: a spec for `nvidia.com/gpu` in /etc/cdi or /var/run/cdi, from `nvidia-ctk cdi
generate`) gives them with `--device nvidia.com/gpu=all` where Docker has CDI on (25-28.1 with
`"features": {"cdi": true}`, on by default from 28.2). A toolkit set to `mode = "cdi"` in
/etc/nvidia-container-runtime/config.toml makes `--gpus` fail. `choose` picks the way that works on
the host, `--gpus` first (what every toolkit install gives), and says why none does otherwise.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

#: CDI's kind for NVIDIA GPUs, and the device that names them all.
CDI_KIND = "nvidia.com/gpu"
CDI_ALL = f"{CDI_KIND}=all"
#: The toolkit's configuration, where its mode is set.
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
GENERATE = "sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"
CDI_ON = ("turn on Docker's CDI (Docker 25-28.1: \"features\": {\"cdi\": true} in /etc/docker/daemon.json, then "
          "restart Docker; on by default from 28.2)")

#: One command: the toolkit's programs on PATH (with sbin, which a user's PATH lacks), its mode, the
#: kind of every CDI spec, and the directories Docker reads CDI specs from (empty: CDI off; the field
#: is unknown to Docker before 25: no output).
FACTS = ("sh", "-c", r"""
PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
for b in nvidia-container-runtime-hook nvidia-cdi-hook nvidia-ctk; do
  if command -v "$b" >/dev/null 2>&1; then echo "$b=yes"; else echo "$b=no"; fi
done
if [ -r "@CONFIG@" ]; then
  printf 'mode=%s\n' "$(sed -n 's/^[[:space:]]*mode[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p' "@CONFIG@" | head -n 1)"
fi
for s in /etc/cdi/*.yaml /etc/cdi/*.yml /etc/cdi/*.json \
         /var/run/cdi/*.yaml /var/run/cdi/*.yml /var/run/cdi/*.json; do
  [ -f "$s" ] || continue
  k=$(sed -n -e 's/^kind:[[:space:]]*//p' -e 's/.*"kind"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' "$s" |
      head -n 1 | tr -d "\"' ")
  printf 'cdi=%s %s\n' "$k" "$s"
done
printf 'docker_cdi=%s\n' "$(docker info --format '{{json .CDISpecDirs}}' 2>/dev/null)"
""".replace("@CONFIG@", TOOLKIT_CONFIG))


@dataclass(frozen=True)
class GpuAccessFacts:
    #: the toolkit's prestart hook on PATH: what `docker run --gpus` runs
    hook: bool = False
    #: nvidia-cdi-hook (what a CDI spec's hooks run) and nvidia-ctk on PATH
    cdi_hook: bool = False
    ctk: bool = False
    #: the toolkit's mode (config.toml; None: no config)
    mode: str | None = None
    #: (kind, spec file) of every CDI spec found
    cdi_specs: tuple[tuple[str, str], ...] = ()
    #: the directories Docker reads CDI specs from (empty: CDI off, or a Docker before 25, which has none:
    #: `docker_cdi_known` tells which)
    docker_cdi: tuple[str, ...] = ()

    @property
    def gpu_specs(self) -> tuple[str, ...]:
        return tuple(path for kind, path in self.cdi_specs if kind == CDI_KIND)

    @property
    def cdi_ready(self) -> bool:
        """Docker reads CDI specs and one of them, where it reads them, is for nvidia.com/gpu."""
        return bool(self.docker_cdi) and any(p.rsplit("/", 1)[0] in self.docker_cdi for p in self.gpu_specs)


def parse(out: str) -> GpuAccessFacts:
    kv: dict[str, str] = {}
    specs: list[tuple[str, str]] = []
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "cdi":
            kind, _, path = value.strip().partition(" ")
            specs.append((kind, path))
        else:
            kv[key] = value.strip()
    docker_cdi: tuple[str, ...] = ()
    try:
        got = json.loads(kv.get("docker_cdi") or "null")
    except json.JSONDecodeError:
        got = None
    if isinstance(got, list):
        docker_cdi = tuple(str(d).rstrip("/") for d in got)
    return GpuAccessFacts(hook=kv.get("nvidia-container-runtime-hook") == "yes",
                          cdi_hook=kv.get("nvidia-cdi-hook") == "yes", ctk=kv.get("nvidia-ctk") == "yes",
                          mode=kv.get("mode") or None, cdi_specs=tuple(specs),
                          docker_cdi=docker_cdi)


@dataclass(frozen=True)
class Choice:
    #: "gpus" (`--gpus all`), "cdi" (`--device nvidia.com/gpu=all`), or None: neither works (what, fix)
    way: str | None
    why: str
    fix: str = ""

    @property
    def flags(self) -> tuple[str, ...]:
        return ("--device", CDI_ALL) if self.way == "cdi" else ("--gpus", "all")


def _has_cdi(docker_version: str) -> bool:
    """Docker 25 and later know CDI (a version we cannot read: assume a current one)."""
    major = docker_version.split(".", 1)[0]
    return not major.isdigit() or int(major) >= 25


def _cdi_lacks(f: GpuAccessFacts, docker_version: str) -> str:
    if not f.docker_cdi:
        return ("Docker's CDI is off" if _has_cdi(docker_version) else
                f"Docker {docker_version} has no CDI (Docker 25+ has it)")
    return f"Docker reads CDI specs from {', '.join(f.docker_cdi)} only"


def choose(f: GpuAccessFacts | None, runtimes: tuple[str, ...] = (), docker_version: str = "") -> Choice:
    """The way the host's Docker gives a container its GPUs. Without the facts (an offline plan, an
    older gather): `--gpus`, where the `nvidia` runtime is registered or nothing is known."""
    if f is None:
        return Choice("gpus", "Docker's `nvidia` runtime" if "nvidia" in runtimes else "not checked")
    if f.mode == "cdi":
        if f.cdi_ready:
            return Choice("cdi", f"the toolkit is in CDI mode; Docker reads {', '.join(f.gpu_specs)}")
        lacks = " and ".join(x for x in ((_cdi_lacks(f, docker_version) if not f.docker_cdi or f.gpu_specs else ""),
                                         ("" if f.gpu_specs else f"no CDI spec for {CDI_KIND}")) if x)
        cdi = [CDI_ON if _has_cdi(docker_version) else "upgrade Docker to 25+"] if not f.docker_cdi else []
        cdi += [] if f.gpu_specs else [GENERATE]
        return Choice(None, f"the NVIDIA Container Toolkit is in mode \"cdi\" ({TOOLKIT_CONFIG}), where `docker run "
                            f"--gpus` fails, and {lacks}",
                      f"set mode = \"auto\" in {TOOLKIT_CONFIG} (then --gpus works), or use CDI: {'; '.join(cdi)}")
    if f.hook:
        return Choice("gpus", "the toolkit's nvidia-container-runtime-hook")
    if f.cdi_ready:
        return Choice("cdi", f"no toolkit hook; Docker reads the CDI spec {', '.join(f.gpu_specs)}")
    if f.gpu_specs:
        return Choice(None, f"a CDI spec for {CDI_KIND} ({', '.join(f.gpu_specs)}) but "
                            f"{_cdi_lacks(f, docker_version)}, and no nvidia-container-runtime-hook on PATH for "
                            "`docker run --gpus`",
                      (CDI_ON if not f.docker_cdi else f"put the spec in {f.docker_cdi[0]}")
                      if _has_cdi(docker_version) else
                      "upgrade Docker to 25+ (CDI), or install nvidia-container-toolkit (its hook serves --gpus)")
    return Choice(None, "neither the NVIDIA Container Toolkit's nvidia-container-runtime-hook (what `docker run "
                        f"--gpus` needs) nor a CDI spec for {CDI_KIND}",
                  "install nvidia-container-toolkit (its hook is enough; no `nvidia` runtime is needed), or "
                  f"generate a CDI spec: {GENERATE}")
