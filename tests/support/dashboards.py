"""Shared by several test modules (moved from tests/test_monitor_pure.py)."""
from __future__ import annotations

import pathlib
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[2]


#: the Grafana dashboard shipped with bootstrap (users import it; its queries are checked here and,
#: against the real Prometheus, in test_sandbox_zfleet.py)
DASHBOARD = ROOT / "dashboards" / "bootstrap-vllm.json"


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    expr: str
    gpu: bool  # needs the DCGM exporter (no data off GPU)


def dashboard_queries(doc: dict) -> list[PanelQuery]:
    """Every PromQL expression of a Grafana dashboard, with its panel's title."""
    out = []
    for p in doc.get("panels", []):
        gpu = "DCGM_" in "".join(t.get("expr", "") for t in p.get("targets", []))
        for t in p.get("targets", []):
            if t.get("expr"):
                out.append(PanelQuery(p.get("title", "?"), t["expr"], gpu))
    return out
