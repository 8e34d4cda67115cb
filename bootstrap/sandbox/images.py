"""Build the sandbox's images locally: base (debootstrap), node, registry and vLLM CPU.

No registry outside this machine is reachable, so everything starts from a Debian rootfs made with
debootstrap and imported into Docker. Every other image is built in stages: a container runs a
stage's script on its parent image (with the stage's files and, for the vLLM image, the wheels
mounted read-only) and is committed. A stage's tag is a short hash of everything that defines it
(parent tag, script, files, image settings), so an unchanged recipe is reused (`docker image
inspect` first) and a changed one rebuilds from the first stage that differs. Each committed stage
stays as an image, which makes a build that failed half-way resume where it stopped. What the
stages are (scripts, files, versions) is in recipes.py.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bootstrap.remote import localdocker as LD

from ._util import (
    LABEL,
    LABEL_KV,
    RECIPE_LABEL,
    ROLE_LABEL,
    Log,
    SandboxError,
    client,
    commit_logged,
    digest,
    file_lock,
    image_exists,
    image_label,
    nolog,
    remove_containers,
    require_docker,
    run_container_logged,
    run_logged,
    sdk,
    tail,
    timed,
)
from .recipes import (
    BASE_CHANGES,
    BASE_FILES,
    BASE_RECIPE,
    BASE_REF,
    BASE_REPO,
    CUDA_SHAPED_REPO,
    MIRROR,
    MIRROR_REPO,
    NIXL_REQS,
    NODE_REPO,
    PIP_REQS,
    PIP_TARGET,
    RAY_LESS_REPO,
    REGISTRY_REPO,
    ROOTFS_RECIPE,
    ROUTER_REQ,
    STAGE_REPO,
    SUITE,
    SUITE_NEW,
    VLLM_REPO,
    SandboxImages,
    Stage,
    base_recipe,
    base_ref,
    cuda_shaped_stage,
    mirror_stage,
    node_stage,
    ray_less_stage,
    registry_stage,
    rootfs_recipe,
    vllm_stages,
)

# --- building --------------------------------------------------------------------------------------


def _debootstrap(workdir: Path, tarball: Path, log: Log, suite: str = SUITE) -> None:
    tmp = workdir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    rootfs = tmp / f"rootfs-{suite}"
    if rootfs.exists():
        shutil.rmtree(rootfs)  # a run that was interrupted: start over
    logs = workdir / "logs" / ("debootstrap.log" if suite == SUITE else f"debootstrap-{suite}.log")
    logs.unlink(missing_ok=True)
    with timed(log, f"debootstrap --variant=minbase {suite} (log: {logs})"):
        run_logged(
            ["debootstrap", "--variant=minbase", suite, str(rootfs), MIRROR],
            logs, what="debootstrap", timeout=1800,
        )
    for rel, text in BASE_FILES.items():
        dst = rootfs / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(text)
        if rel.startswith("usr/sbin/"):
            dst.chmod(0o755)
    for pattern in ("var/cache/apt/archives/*.deb", "var/lib/apt/lists/*"):
        for p in rootfs.glob(pattern):
            if p.is_file():
                p.unlink()
    partial = tarball.with_suffix(".partial")
    with timed(log, f"packing rootfs into {tarball.name}"):
        run_logged(
            ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."],
            logs, what="tar rootfs", timeout=1800,
        )
        partial.rename(tarball)
    shutil.rmtree(rootfs)


def _ensure_base(workdir: Path, log: Log, suite: str = SUITE) -> str:
    ref, recipe = (BASE_REF, BASE_RECIPE) if suite == SUITE else (base_ref(suite), base_recipe(suite))
    if image_label(ref, RECIPE_LABEL) == recipe:
        log(f"image {ref}: present")
        return ref
    tarball = workdir / "base" / f"{suite}-minbase-{ROOTFS_RECIPE if suite == SUITE else rootfs_recipe(suite)}.tar"
    tarball.parent.mkdir(parents=True, exist_ok=True)
    if tarball.exists():
        log(f"rootfs tarball cached: {tarball}")
    else:
        _debootstrap(workdir, tarball, log, suite)
    with timed(log, f"docker import {ref}"):
        what = f"docker import {ref}"
        repo, tag = LD.split_ref(ref)
        changes = [f"LABEL {LABEL_KV}", f"LABEL {RECIPE_LABEL}={recipe}", *BASE_CHANGES]
        with sdk(what):  # the tarball is streamed from disk to the daemon
            out = client(1800).api.import_image_from_file(str(tarball), repository=repo, tag=tag, changes=changes)
        for line in str(out).splitlines():  # the daemon answers with JSON lines; a failure is one of them
            try:
                err = json.loads(line).get("error")
            except (ValueError, AttributeError):
                continue
            if err:
                raise SandboxError(f"{what} failed: {err}")
        if image_label(ref, RECIPE_LABEL) != recipe:
            raise SandboxError(f"{what} failed: the image is not there afterwards ({tail(str(out), 3)})")
    return ref


def _build_stage(stage: Stage, workdir: Path, log: Log) -> str:
    ref = stage.ref
    if image_exists(ref):
        log(f"image {ref}: present")
        return ref
    parent = stage.parent.split("@", 1)[0]  # base is referenced as BASE_REF@recipe in the hash
    if not image_exists(parent):
        raise SandboxError(f"building {ref}: parent image {parent} is missing")
    container = f"bootstrap-sandbox-build-{stage.name}"
    logfile = workdir / "logs" / f"build-{stage.name}.log"
    logfile.unlink(missing_ok=True)
    remove_containers([container], check=False)
    with tempfile.TemporaryDirectory(prefix=f"recipe-{stage.name}-", dir=workdir / "tmp") as rdir:
        for name, data in stage.files:
            (Path(rdir) / name).write_bytes(data)
        os.chmod(rdir, 0o755)
        volumes = [f"{rdir}:/recipe:ro", *[f"{host}:{inside}:ro" for host, inside in stage.mounts]]
        try:
            with timed(log, f"building {ref} (log: {logfile})"):
                # `docker run --name C --label ... -v ... PARENT /bin/sh -euxc SCRIPT`, output into the log.
                # No entrypoint: it would stick to the committed image. Parents never set one.
                run_container_logged(parent, ["/bin/sh", "-euxc", stage.script], logfile,
                                     what=f"building {ref}", timeout=3600, name=container,
                                     labels={LABEL: "1", ROLE_LABEL: "build"}, volumes=volumes)
                changes = [*stage.changes, f"LABEL {ROLE_LABEL}=image", f"LABEL {RECIPE_LABEL}={stage.recipe}"]
                if not any(c.startswith("CMD") for c in changes):
                    changes.append('CMD ["/bin/bash"]')
                commit_logged(container, ref, changes, logfile, what=f"committing {ref}", timeout=3600)
        finally:
            remove_containers([container], check=False)
    return ref


def _ensure_all_wheels(workdir: Path, stages: list[Stage], log: Log) -> None:
    """Every wheel the vLLM stages install that is not in a built stage already."""
    if not all(image_exists(s.ref) for s in stages[1:3]):
        _ensure_wheels(workdir, log)
    _ensure_router_wheels(workdir, log)
    _ensure_nixl_wheels(workdir, log)


def _ensure_wheels(workdir: Path, log: Log) -> Path:
    return _download(workdir, "wheels", PIP_REQS, log)


def _ensure_router_wheels(workdir: Path, log: Log) -> Path:
    """vllm-router and what it needs that the vLLM stage lacks, downloaded here (the image has no
    index to install from)."""
    return _download(workdir, "router-wheels", (ROUTER_REQ,), log)


def _ensure_nixl_wheels(workdir: Path, log: Log) -> Path:
    """NIXL's wheels (no dependencies: see NIXL_REQS), downloaded here for the image's Python."""
    return _download(workdir, "nixl-wheels", NIXL_REQS, log, "--no-deps")


def _download(workdir: Path, folder: str, reqs: tuple[str, ...], log: Log, *options: str) -> Path:
    """`pip download` of `reqs` for the image's Python into workdir/folder, once (a marker names
    what was downloaded)."""
    wheels = workdir / folder
    marker = wheels / f".complete-{digest(*reqs, *options, *PIP_TARGET)}"
    if marker.exists():
        return wheels
    wheels.mkdir(parents=True, exist_ok=True)
    logfile = workdir / "logs" / f"pip-download-{folder}.log"
    logfile.unlink(missing_ok=True)
    with timed(log, f"pip download {' '.join(reqs)} into {wheels} (log: {logfile})"):
        run_logged(
            [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", *options,
             "-d", str(wheels), *PIP_TARGET, *reqs],
            logfile, what="pip download", timeout=3600,
        )
    marker.write_text(time.strftime("%Y-%m-%dT%H:%M:%S\n"))
    return wheels


def planned_images(workdir: Path) -> SandboxImages:
    """The references ensure_images would produce, without building anything."""
    stages = vllm_stages(Path(workdir) / "wheels")
    return SandboxImages(
        base=BASE_REF, node=node_stage().ref, vllm=stages[-1].ref, registry=registry_stage().ref,
        mirror=mirror_stage().ref,
    )


def ensure_images(workdir: Path, log: Log = nolog) -> SandboxImages:
    """Build (or reuse) the base, node, registry and vLLM CPU images; return their references."""
    workdir = Path(workdir).expanduser()
    require_docker()
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    planned = planned_images(workdir)
    with file_lock(workdir / ".images.lock"):
        for stale in (workdir / "tmp").glob("recipe-*"):  # left by an interrupted build
            shutil.rmtree(stale, ignore_errors=True)
        if all(image_exists(r) for r in (planned.node, planned.registry, planned.vllm, planned.mirror)):
            log(f"images present: {planned.node}, {planned.registry}, {planned.vllm}")
            stages = vllm_stages(workdir / "wheels")
            _prune_superseded(
                {BASE_REF, planned.node, planned.registry, planned.mirror, *(s.ref for s in stages),
                 *_variants(planned.vllm)}, planned.vllm_tag, log
            )
            return planned
        start = time.monotonic()
        stages = vllm_stages(workdir / "wheels")
        building = not image_exists(stages[-1].ref)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            # the wheels download (a minute or more) while the base, node, registry and apt stages
            # build: only the vLLM stages after the first install them
            wheels = pool.submit(_ensure_all_wheels, workdir, stages, log) if building else None
            _ensure_base(workdir, log)
            node = _build_stage(node_stage(), workdir, log)
            registry = _build_stage(registry_stage(), workdir, log)
            mirror = _build_stage(mirror_stage(), workdir, log)
            if wheels is not None:
                _build_stage(stages[0], workdir, log)
                wheels.result()
                for stage in stages[1:]:
                    _build_stage(stage, workdir, log)
        vllm = stages[-1].ref
        log(f"images ready in {time.monotonic() - start:.1f}s")
        _prune_superseded({BASE_REF, node, registry, mirror, *(s.ref for s in stages), *_variants(vllm)},
                          stages[-1].recipe, log)
        return SandboxImages(base=BASE_REF, node=node, vllm=vllm, registry=registry, mirror=mirror)


def _variants(vllm: str) -> tuple[str, ...]:
    """The variants of the vLLM image `vllm` (built on demand, kept while it is)."""
    return ray_less_stage(vllm).ref, cuda_shaped_stage(vllm).ref


def ensure_ray_less_image(workdir: Path, log: Log = nolog) -> str:
    """Build (or reuse) the Ray-less variant of the vLLM image; return its local reference."""
    return _ensure_variant(workdir, ray_less_stage, log)


def ensure_cuda_shaped_image(workdir: Path, log: Log = nolog) -> str:
    """Build (or reuse) the CUDA-shaped variant of the vLLM image (recipes.cuda_shaped_stage); its local reference."""
    return _ensure_variant(workdir, cuda_shaped_stage, log)


def _ensure_variant(workdir: Path, stage_of, log: Log) -> str:
    workdir = Path(workdir).expanduser()
    images = ensure_images(workdir, log)
    with file_lock(workdir / ".images.lock"):
        return _build_stage(stage_of(images.vllm), workdir, log)


def new_node_ref() -> str:
    """The reference ensure_new_node_image would produce."""
    return node_stage(SUITE_NEW).ref


def ensure_new_node_image(workdir: Path, log: Log = nolog) -> str:
    """Build (or reuse) the node image on Debian 13 (its Docker 26.1), the mixed rack's odd node; return its
    local reference. Built only when a mixed sandbox asks for it (a debootstrap and the node's packages)."""
    workdir = Path(workdir).expanduser()
    require_docker()
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    with file_lock(workdir / ".images.lock"):
        stage = node_stage(SUITE_NEW)
        if not image_exists(stage.ref):
            _ensure_base(workdir, log, SUITE_NEW)
        return _build_stage(stage, workdir, log)


def _prune_superseded(keep: set[str], vllm_tag: str, log: Log) -> None:
    """Untag sandbox images built from older recipes (a vLLM image is GBs); ignore ones in use."""
    cl = client()
    try:  # docker images --filter label=ROLE=image: every repo:tag of those images
        refs = [t for img in cl.api.images(filters={"label": f"{ROLE_LABEL}=image"}) for t in img.get("RepoTags") or ()]
    except LD.ERRORS:
        refs = []
    keep = keep | {base_ref(SUITE_NEW), node_stage(SUITE_NEW).ref}
    ours = (BASE_REPO, NODE_REPO, VLLM_REPO, REGISTRY_REPO, STAGE_REPO, RAY_LESS_REPO, MIRROR_REPO, CUDA_SHAPED_REPO)
    stale = []
    for ref in refs:
        repo, _, tag = ref.rpartition(":")
        if ref in keep or tag == "<none>":
            continue
        if repo in ours or (repo.endswith(("/bootstrap/vllm-cpu", "/bootstrap/vllm-cpu-noray")) and tag != vllm_tag):
            stale.append(ref)
    for ref in stale:
        try:  # docker rmi REF: untags it, removes the image with its last tag; refused while in use
            cl.api.remove_image(ref)
        except LD.ERRORS:
            continue
        log(f"removed superseded image {ref}")
