"""The import rules of docs/architecture.md, checked on the source (an AST walk, no imports run).

- Pure modules never import `bootstrap.remote` (SSH, fan-out, the session, Docker argv), directly or
  through another bootstrap module.
- Only `bootstrap.cli` imports click or rich.
- No capability imports another capability's `run.py` (shared remote steps live in cluster/probe,
  cluster/ray, remote/*; shared pure pieces in the capabilities' pure modules), with one exception:
  the fleet drives each replica group's cluster through cluster/run.py (up, status, down: issue 26.3),
  the layer below it.
- Layers run one way: remote/ never reaches cluster/ or a capability above it, cluster/ never reaches
  doctor, serve, fleet, monitor, nccl (nor the CLI or the sandbox on top), directly or through another
  bootstrap module. What both layers need lives below both (bootstrap.containers).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "bootstrap"

PURE = ("bootstrap.errors", "bootstrap.model", "bootstrap.exposure", "bootstrap.inventory", "bootstrap.containers",
        "bootstrap.cluster.plan", "bootstrap.cluster.allow", "bootstrap.cluster.fencedoc",
        "bootstrap.cluster.imagecopy", "bootstrap.cluster.facts", "bootstrap.cluster.rack",
        "bootstrap.inventory.reference", "bootstrap.doctor.logsources",
        "bootstrap.nccl.parse", "bootstrap.doctor.signatures", "bootstrap.doctor.rules",
        "bootstrap.serve.plan", "bootstrap.serve.split", "bootstrap.serve.flags", "bootstrap.serve.argv",
        "bootstrap.serve.sizing", "bootstrap.serve.manifest", "bootstrap.serve.kvlog", "bootstrap.serve.experts",
        "bootstrap.serve.passthrough", "bootstrap.serve.mode", "bootstrap.fleet.plan", "bootstrap.fleet.names",
        "bootstrap.fleet.routers", "bootstrap.monitor.plan",
        "bootstrap.monitor.metrics")
CAPABILITIES = ("cluster", "nccl", "doctor", "serve", "fleet", "monitor")
UI_LIBS = ("click", "rich")
#: (capability, the other capability whose run.py it may import): the fleet brings up, reads and tears
#: down each replica group's cluster with cluster/run.py, which is below it (and refuses a fleet).
RUN_ALLOWED = {("fleet", "cluster")}
#: Layers run one way: what a module under each key must never reach. The capabilities built on the
#: cluster (and the CLI and the sandbox, on top of everything) sit above cluster/; cluster/ above remote/.
_ABOVE_CLUSTER = (*(f"bootstrap.{c}" for c in CAPABILITIES if c != "cluster"), "bootstrap.cli", "bootstrap.sandbox")
ABOVE = {"bootstrap.remote": ("bootstrap.cluster", *_ABOVE_CLUSTER), "bootstrap.cluster": _ABOVE_CLUSTER}


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every module this file imports (absolute names; `from a import b` gives a and a.b)."""
    tree = ast.parse(path.read_text(), str(path))
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def all_modules() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in PKG.rglob("*.py")}


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def closure(graph: dict[str, set[str]], start: str) -> dict[str, str]:
    """bootstrap modules reachable from start -> the module that first imports it."""
    seen: dict[str, str] = {}
    todo = [start]
    while todo:
        cur = todo.pop()
        for dep in sorted(graph.get(cur, ())):
            if dep.startswith("bootstrap") and dep in graph and dep not in seen and dep != start:
                seen[dep] = cur
                todo.append(dep)
    return seen


def violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for mod in sorted(graph):
        if any(_under(mod, p) for p in PURE):
            for dep, via in closure(graph, mod).items():
                if _under(dep, "bootstrap.remote"):
                    found.append(f"pure {mod} reaches {dep} (imported by {via})")
        if not _under(mod, "bootstrap.cli"):
            for dep in graph[mod]:
                if any(_under(dep, lib) for lib in UI_LIBS):
                    found.append(f"{mod} imports {dep}: only bootstrap.cli may")
        for layer, above in ABOVE.items():
            if _under(mod, layer):
                for dep, via in closure(graph, mod).items():
                    if any(_under(dep, a) for a in above):
                        found.append(f"{mod} reaches {dep} (imported by {via}): layers run one way, "
                                     f"{layer} is below it")
        cap = mod.split(".")[1] if mod.count(".") >= 1 else ""
        for dep in graph[mod]:
            parts = dep.split(".")
            if len(parts) == 3 and parts[0] == "bootstrap" and parts[1] in CAPABILITIES and parts[2] == "run" \
                    and parts[1] != cap and (cap, parts[1]) not in RUN_ALLOWED and not _under(mod, "bootstrap.cli"):
                found.append(f"{mod} imports {dep}: another capability's run.py")
    return found


def test_the_package_keeps_its_import_rules():
    found = violations(all_modules())
    assert not found, "import rules broken (docs/architecture.md):\n" + "\n".join(found)


def test_the_pure_list_names_real_modules():
    graph = all_modules()
    for p in PURE:
        assert any(_under(m, p) for m in graph), p


@pytest.mark.parametrize("mod, extra, want", [
    ("bootstrap.serve.plan", "bootstrap.remote.ssh", "pure bootstrap.serve.plan reaches bootstrap.remote.ssh"),
    ("bootstrap.nccl.parse", "bootstrap.cluster.probe", "pure bootstrap.nccl.parse reaches bootstrap.remote"),
    ("bootstrap.cluster.run", "click", "bootstrap.cluster.run imports click"),
    ("bootstrap.fleet.run", "bootstrap.serve.run", "another capability's run.py"),
    # the fleet may drive cluster/run.py (the layer below it); no other capability may
    ("bootstrap.serve.run", "bootstrap.cluster.run", "another capability's run.py"),
    ("bootstrap.monitor.run", "bootstrap.cluster.run", "another capability's run.py"),
    # layers run one way (issue 26): each import that once ran back up
    ("bootstrap.remote.docker", "bootstrap.cluster.facts",
     "bootstrap.remote.docker reaches bootstrap.cluster.facts (imported by bootstrap.remote.docker)"),
    ("bootstrap.cluster.run", "bootstrap.serve.state",
     "bootstrap.cluster.run reaches bootstrap.serve.state (imported by bootstrap.cluster.run)"),
    ("bootstrap.cluster.probe", "bootstrap.doctor.signatures",
     "bootstrap.cluster.probe reaches bootstrap.doctor.signatures (imported by bootstrap.cluster.probe)"),
    # ... and through another module: cluster.run -> cluster.probe -> doctor
    ("bootstrap.cluster.probe", "bootstrap.doctor.rules",
     "bootstrap.cluster.run reaches bootstrap.doctor.rules (imported by bootstrap.cluster.probe)"),
    ("bootstrap.remote.session", "bootstrap.monitor.metrics", "bootstrap.remote.session reaches bootstrap.monitor"),
    ("bootstrap.cluster.facts", "bootstrap.cli.render", "bootstrap.cluster.facts reaches bootstrap.cli.render"),
])
def test_a_forbidden_import_is_caught(mod, extra, want):
    graph = all_modules()
    graph[mod] = graph[mod] | {extra}
    assert any(want in v for v in violations(graph)), violations(graph)


def test_imports_of_resolves_relative_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "bootstrap" / "serve"
    pkg.mkdir(parents=True)
    f = pkg / "plan.py"
    f.write_text("from ..remote import ssh\nfrom . import run\nimport rich.table\n")
    monkeypatch.setattr(sys.modules[__name__], "PKG", tmp_path / "bootstrap")
    assert {"bootstrap.remote.ssh", "bootstrap.serve.run", "rich.table"} <= imports_of(f)


def test_only_the_fleet_may_drive_cluster_run():
    """The one exception to "no capability imports another's run.py": fleet/lifecycle.py runs
    cluster/run.py per replica group. The same import from anywhere else is still caught, and the
    fleet still may not import any other capability's run.py."""
    graph = all_modules()
    assert "bootstrap.cluster.run" in graph["bootstrap.fleet.lifecycle"]
    assert not [v for v in violations(graph) if v.startswith("bootstrap.fleet.")]
    graph["bootstrap.fleet.lifecycle"] = graph["bootstrap.fleet.lifecycle"] | {"bootstrap.monitor.run"}
    assert any(v.startswith("bootstrap.fleet.lifecycle imports bootstrap.monitor.run") for v in violations(graph))
