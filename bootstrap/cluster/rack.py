"""The rack preflight's old names, kept importable: the checks moved to bootstrap.cluster.preflight.

The node checks are entries of the registry in preflight/checks.py (CHECKS: those `--skip-check`
takes), their rules in preflight/rules.py, the rack facts' command and parser in cluster/facts.py.
"""
from __future__ import annotations

# moved to bootstrap.cluster.facts (re-floor): the rack facts' command and parser
from bootstrap.cluster.facts import _SCRIPT as _SCRIPT
from bootstrap.cluster.facts import CAP_SYS_RESOURCE as CAP_SYS_RESOURCE
from bootstrap.cluster.facts import RACK_FACTS as RACK_FACTS
from bootstrap.cluster.facts import IBPort as IBPort
from bootstrap.cluster.facts import Link as Link
from bootstrap.cluster.facts import RackFacts as RackFacts
from bootstrap.cluster.facts import parse_dockerd as parse_dockerd
from bootstrap.cluster.facts import parse_ib_port as parse_ib_port
from bootstrap.cluster.facts import parse_link as parse_link
from bootstrap.cluster.facts import parse_rack as parse_rack

# moved to bootstrap.cluster.preflight.checks (re-floor): the checks, one registry entry each
from bootstrap.cluster.preflight.checks import CHECKS as CHECKS
from bootstrap.cluster.preflight.checks import MAX_SKEW_S as MAX_SKEW_S
from bootstrap.cluster.preflight.checks import MIN_NOFILE as MIN_NOFILE
from bootstrap.cluster.preflight.checks import MIN_SHM_BYTES as MIN_SHM_BYTES
from bootstrap.cluster.preflight.checks import check_rack as check_rack

# moved to bootstrap.cluster.preflight.registry (re-floor): what the checks read and find
from bootstrap.cluster.preflight.registry import Finding as RackFinding
from bootstrap.cluster.preflight.registry import RackNode as RackNode
from bootstrap.cluster.preflight.registry import nodes_from as nodes_from

# moved to bootstrap.cluster.preflight.rules (re-floor): NCCL's variables, CUDA versions
from bootstrap.cluster.preflight.rules import forward_compatible as forward_compatible
from bootstrap.cluster.preflight.rules import ib_hcas as ib_hcas
from bootstrap.cluster.preflight.rules import image_cuda_need as image_cuda_need
from bootstrap.cluster.preflight.rules import select_interfaces as select_interfaces

__all__ = ["CAP_SYS_RESOURCE", "CHECKS", "IBPort", "Link", "MAX_SKEW_S", "MIN_NOFILE", "MIN_SHM_BYTES", "RACK_FACTS",
           "RackFacts", "RackFinding", "RackNode", "check_rack", "forward_compatible", "ib_hcas", "image_cuda_need",
           "nodes_from", "parse_dockerd", "parse_ib_port", "parse_link", "parse_rack", "select_interfaces"]
