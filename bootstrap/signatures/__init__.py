"""Diagnosis, pure: known failure signatures in node logs, and consistency checks across nodes.

Pure: text and values in, findings out; nothing here touches a host. Three entry points:

* `scan_log(host, text, infiniband=...)` matches a log against `SIGNATURES`, a table of messages that
  vLLM, Ray, NCCL, Gloo, Docker and huggingface_hub print for the failures multi-node clusters hit.
  Feed it what a node produced: `docker logs <node container>` (the `ray start --block` output, and on
  the head the `vllm serve` output, which carries worker lines prefixed `(RayWorkerWrapper pid=…,
  ip=…)`), a `docker pull`/`docker run` error, or a run with `NCCL_DEBUG=INFO`.
* `root_cause(text)` picks vLLM's own root-cause line out of a failed `vllm serve` log: the last specific
  exception (or pydantic validation error), past wrappers such as "Engine core initialization failed".
* `check_cluster(reports)` compares per-host values (`HostReport`) gathered by the caller: GPU counts,
  drivers, clocks, free disk, VLLM_HOST_IP against Ray's node IP, *_SOCKET_IFNAME against the host's
  interfaces.

Every finding names a cause and a concrete fix. Evidence is one trimmed line with tokens masked.

Layout: engine.py (the Signature type, matching, masking, ordering), one data module per source of the
failure lines (ray.py, container.py, nccl.py, resources.py, vllm.py: each a tuple of `Signature`
entries, with the functions that build their fixes beside them), rootcause.py, cluster_checks.py.
A new signature is one entry in its data module and a sample line in tests/signatures/test_signature_samples.py.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from bootstrap.signatures import container, nccl, ray, resources, vllm
from bootstrap.signatures.cluster_checks import (
    GIB,
    SOCKET_IFNAME_VARS,
    HostReport,
    Interface,
    check_cluster,
    parse_ip_addr,
)
from bootstrap.signatures.engine import (
    MAX_EVIDENCE,
    SEVERITIES,
    Finding,
    Pattern,
    Signature,
    mask_secrets,
    scan,
    sort_findings,
)
from bootstrap.signatures.nccl import PER_NODE_ENV
from bootstrap.signatures.rootcause import root_cause, root_cause_of

__all__ = [
    "GIB", "MAX_EVIDENCE", "PER_NODE_ENV", "SEVERITIES", "SIGNATURES", "SOCKET_IFNAME_VARS", "Finding",
    "HostReport", "Interface", "Pattern", "Signature", "check_cluster", "mask_secrets", "parse_ip_addr",
    "root_cause", "root_cause_of", "scan_log", "scan_logs", "scan_sources", "signature", "sort_findings",
]

#: Every signature, in a stable order (the data modules' in turn).
SIGNATURES: tuple[Signature, ...] = (ray.SIGNATURES + container.SIGNATURES + nccl.SIGNATURES
                                     + resources.SIGNATURES + vllm.SIGNATURES)
_BY_ID = {s.id: s for s in SIGNATURES}


def signature(id: str) -> Signature:
    return _BY_ID[id]


def scan_log(host: str | None, text: str, *, infiniband: bool = False) -> list[Finding]:
    """Findings for the known signatures in `text`, one per signature, ordered by severity.

    The evidence is the first line that matched; the severity is the highest any matching line
    carries (a Gloo loopback warning followed by connectFullMesh failing is an error). `infiniband`
    says InfiniBand is configured for the cluster, which turns NCCL's socket fallback into a finding.
    A symptom is dropped when a signature naming its cause is found too (`Signature.suppressed_by`).
    """
    return scan(SIGNATURES, host, text, infiniband=infiniband)


def scan_logs(logs: Mapping[str | None, str], *, infiniband: bool = False) -> list[Finding]:
    """`scan_log` over several hosts' logs ({host: text}), merged and ordered."""
    out: list[Finding] = []
    for host, text in logs.items():
        out.extend(scan_log(host, text, infiniband=infiniband))
    return sort_findings(out)


def scan_sources(logs: Mapping[tuple[str | None, str], str], *, infiniband: bool = False) -> list[Finding]:
    """`scan_log` over each log a host holds ({(host, source): text}: the node container's, vLLM's,
    the keeper's, the router's, Prometheus'), each finding naming its source. One finding per
    signature and host (the first source's, in the mapping's order); a symptom is dropped when a
    signature naming its cause is found in any log of the same host (vLLM's refusal explains the
    node log's symptom)."""
    per_host: dict[str | None, dict[str, Finding]] = {}
    for (host, source), text in logs.items():
        for f in scan_log(host, text, infiniband=infiniband):
            per_host.setdefault(host, {}).setdefault(f.id, replace(f, source=source))
    out = [f for found in per_host.values() for f in found.values()
           if not any(cause in found for cause in signature(f.id).suppressed_by)]
    return sort_findings(out)
