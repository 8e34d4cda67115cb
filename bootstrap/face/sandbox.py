"""The library face's sandbox commands: a local cluster of simulated hosts up (with its shape) and down.
"""
from __future__ import annotations

from bootstrap.errors import BootstrapError, UsageError
from bootstrap.face import results as R


def sandbox_up(nodes: int, *, kind: str = "full", ray: bool = True, gpus: int = 0, ib: str | None = None,
               hcas: int = 1, registry_link: str | None = None, node_link: str | None = None,
               mixed: bool = False, log=None) -> R.SandboxResult:
    """`sandbox up`: the images (cached), the registry and `nodes` nodes of this shape; log(message)
    for progress. A shape that does not hold together raises UsageError."""
    from bootstrap import sandbox as S

    if not ray and kind != "full":
        raise UsageError("--without-ray needs --kind full (sshd-only nodes run no containers)")
    if (gpus or ib) and kind != "full":
        raise UsageError("--gpus and --ib need --kind full (GPUs are seen through each node's Docker)")
    if hcas != 1 and not ib:
        raise UsageError("--hcas needs --ib")
    if mixed and (why := S.mixed_refusal(nodes, kind)):
        raise UsageError(why)
    shape = S.GpuShape(gpus=gpus, ib=ib, hcas=hcas)
    try:
        links = S.LinkShape(
            registry_bits=S.parse_rate(registry_link, "--registry-link") if registry_link is not None else None,
            node_bits=S.parse_rate(node_link, "--node-link") if node_link is not None else None)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        info = S.sandbox_up(nodes, log=log, kind=kind, ray=ray, gpu=shape, links=links, mixed=mixed)
    except (RuntimeError, OSError, ValueError) as exc:
        raise BootstrapError(f"sandbox: {exc}") from None
    return R.SandboxResult(info)


def sandbox_down(*, log=None) -> R.SandboxResult:
    """`sandbox down`: the nodes, the registry container and the network removed."""
    from bootstrap import sandbox as S

    try:
        S.sandbox_down(log=log)
    except (RuntimeError, OSError) as exc:
        raise BootstrapError(f"sandbox: {exc}") from None
    return R.SandboxResult()
