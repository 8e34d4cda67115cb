"""The import rules of docs/architecture.md, checked on the source (an AST walk, no imports run).

- Pure modules never import `bootstrap.remote` (SSH, fan-out, the session, Docker steps), directly or
  through another bootstrap module; but for `bootstrap.remote.argv`, the pure `docker run/create` builder.
- Only `bootstrap.cli` imports click or rich.
- No capability imports another capability's `run.py` (shared remote steps live in cluster/probe,
  cluster/ray, remote/*; shared pure pieces in the capabilities' pure modules), with one exception:
  the fleet drives each replica group's cluster through cluster/run.py (up, status, down: issue 26.3),
  the layer below it.
- Layers run one way: remote/ never reaches cluster/ or a capability above it, cluster/ never reaches
  doctor, serve, fleet, monitor, nccl (nor the CLI or the sandbox on top), directly or through another
  bootstrap module. What both layers need lives below both (bootstrap.containers).
- Floors run one way (issue 50): every top-level module and folder of `bootstrap/` stands on one floor
  of FLOORS, and a module imports only what stands on a lower floor, or its own folder (imports inside
  functions count). So a capability never imports one above it (doctor/ is a top-floor command over
  them all; the pure signatures they share are bootstrap/signatures/, below them).
- No circle inside a folder: the modules of one package never import each other in a loop (again
  counting imports inside functions, which hide a circle from the interpreter but not from a reader).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "bootstrap"

PURE = ("bootstrap.errors", "bootstrap.model", "bootstrap.exposure", "bootstrap.inventory", "bootstrap.containers",
        "bootstrap.cluster.plan", "bootstrap.cluster.guard.allow", "bootstrap.cluster.guard.fencedoc",
        "bootstrap.cluster.guard.fence", "bootstrap.cluster.guard.secretstore",
        "bootstrap.cluster.imagedist.plan", "bootstrap.cluster.facts", "bootstrap.cluster.preflight.registry",
        "bootstrap.cluster.preflight.checks", "bootstrap.cluster.preflight.rules", "bootstrap.cluster.preflight.ports",
        "bootstrap.inventory.reference", "bootstrap.doctor.logsources",
        "bootstrap.nccl.parse", "bootstrap.signatures",
        "bootstrap.serve.split", "bootstrap.serve.flags", "bootstrap.serve.argv",
        "bootstrap.serve.sizing", "bootstrap.serve.manifest", "bootstrap.serve.kvlog", "bootstrap.serve.experts",
        "bootstrap.serve.passthrough", "bootstrap.serve.mode", "bootstrap.serve.benchload",
        "bootstrap.serve.benchstats", "bootstrap.fleet.plan", "bootstrap.fleet.names",
        "bootstrap.fleet.routers", "bootstrap.monitor.plan",
        "bootstrap.monitor.metrics")
CAPABILITIES = ("cluster", "nccl", "doctor", "serve", "fleet", "monitor")
UI_LIBS = ("click", "rich")
#: (capability, the other capability whose run.py it may import): the fleet brings up, reads and tears
#: down each replica group's cluster with cluster/run.py, which is below it (and refuses a fleet).
RUN_ALLOWED = {("fleet", "cluster")}
#: Layers run one way: what a module under each key must never reach. The capabilities built on the
#: cluster (and the CLI and the sandbox, on top of everything) sit above cluster/; cluster/ above remote/.
_ABOVE_CLUSTER = (*(f"bootstrap.{c}" for c in CAPABILITIES if c != "cluster"), "bootstrap.signatures",
                  "bootstrap.face", "bootstrap.cli", "bootstrap.sandbox")
#: What of bootstrap.remote a pure module may import: the pure `docker run/create` builder (it imports
#: nothing but the standard library: tests/remote/test_argv.py) and its package (an __init__ without imports).
PURE_REMOTE = ("bootstrap.remote", "bootstrap.remote.argv")
ABOVE = {"bootstrap.remote": ("bootstrap.cluster", *_ABOVE_CLUSTER), "bootstrap.cluster": _ABOVE_CLUSTER}
#: The floors of the package, the ground first: each top-level module or folder of bootstrap/ (a unit)
#: imports only units on a lower floor (and itself); units on one floor never import each other. A new
#: top-level module or folder must be placed here (test_every_unit_stands_on_a_floor).
FLOORS = (
    ("errors", "model", "containers", "parallel"),  # pure ground: typed inventory, errors, fan-out
    ("exposure", "remote"),  # what a public address would reach; SSH, Docker argv, the Session
    ("cluster",),  # one cluster's facts, plan, up/status/down, and its wings (guard/: fence, token, secrets)
    ("inventory", "signatures"),  # the loader (it checks fence_allow with cluster/guard); doctor's signatures
    ("nccl", "serve"),  # check-nccl and the network look; serving one replica group
    ("fleet",),  # replicas behind a router
    ("monitor",),  # Prometheus and `top` over the fleet
    ("doctor", "sandbox"),  # doctor and logs over every capability; the local testbed
    ("face",),  # the library face: load, route one cluster vs a fleet, result objects (what the CLI calls)
    ("cli",),  # the only code that prints
    ("__main__",),
)


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_statements(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """Each import of this file, inside functions too: (absolute module, the names `from` takes of it;
    () for a plain `import`)."""
    tree = ast.parse(path.read_text(), str(path))
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: list[tuple[str, tuple[str, ...]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((a.name, ()) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            out.append((base, tuple(a.name for a in node.names)))
    return out


def imports_of(path: Path) -> set[str]:
    """Every module this file imports (absolute names; `from a import b` gives a and a.b)."""
    out: set[str] = set()
    for base, names in import_statements(path):
        out.add(base)
        out.update(f"{base}.{n}" for n in names)
    return out


def all_modules() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in PKG.rglob("*.py")}


def module_arrows() -> dict[str, set[str]]:
    """bootstrap module -> the bootstrap modules it needs: `from a import b` needs the module a.b where
    there is one (a's __init__ is only run, not read), else a."""
    paths = {module_name(p): p for p in PKG.rglob("*.py")}
    out: dict[str, set[str]] = {}
    for mod, path in paths.items():
        out[mod] = set()
        for base, names in import_statements(path):
            subs = {f"{base}.{n}" for n in names} & paths.keys()
            out[mod] |= (subs | ({base} if len(subs) < len(names) or not names else set())) & paths.keys()
    return out


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


def unit(mod: str) -> str:
    """The top-level module or folder of bootstrap/ a module is in ('' for the package face itself)."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def floor_of(mod: str) -> int | None:
    u = unit(mod)
    return next((i for i, units in enumerate(FLOORS) if u in units), None)


def back_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a unit on the same or a higher floor (bootstrap/__init__.py, the version, is no floor's)."""
    found = []
    for mod in sorted(graph):
        here = floor_of(mod)
        for dep in sorted(graph[mod]):
            if dep not in graph or not unit(dep) or unit(dep) == unit(mod):
                continue
            there = floor_of(dep)
            if here is None or there is None or there >= here:
                found.append(f"{mod} imports {dep}: floors run one way, {unit(mod)} (floor {here}) may not "
                             f"import {unit(dep)} (floor {there})")
    return found


def folder_of(mod: str) -> str:
    """The package a module's file lies in (a package's __init__ lies in its own)."""
    return mod if (PKG.parent / mod.replace(".", "/")).is_dir() else mod.rpartition(".")[0]


def folder_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles among the modules of one folder (each a strongly connected set of over one module,
    or a module importing itself), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def edges(m: str) -> list[str]:
        return sorted(d for d in graph[m] if d in graph and folder_of(d) == folder_of(m))

    def visit(m: str) -> None:  # Tarjan's strongly connected components
        index[m] = low[m] = len(index)
        stack.append(m)
        for d in edges(m):
            if d not in index:
                visit(d)
                low[m] = min(low[m], low[d])
            elif d in stack:
                low[m] = min(low[m], index[d])
        if low[m] == index[m]:
            comp = []
            while True:
                x = stack.pop()
                comp.append(x)
                if x == m:
                    break
            if len(comp) > 1 or m in graph[m]:
                out.append(sorted(comp))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return sorted(out)


def violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for mod in sorted(graph):
        if any(_under(mod, p) for p in PURE):
            for dep, via in closure(graph, mod).items():
                if _under(dep, "bootstrap.remote") and dep not in PURE_REMOTE:
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
                    and parts[1] != cap and (cap, parts[1]) not in RUN_ALLOWED and not _under(mod, "bootstrap.cli") \
                    and not _under(mod, "bootstrap.face"):
                found.append(f"{mod} imports {dep}: another capability's run.py")
    return found


def test_the_package_keeps_its_import_rules():
    found = violations(all_modules())
    assert not found, "import rules broken (docs/architecture.md):\n" + "\n".join(found)


def test_floors_run_one_way():
    found = back_arrows(all_modules())
    assert not found, "imports that run back up (tests/test_architecture.py FLOORS):\n" + "\n".join(found)


def test_every_unit_stands_on_a_floor():
    units = {unit(m) for m in all_modules()} - {""}
    placed = {u for floor in FLOORS for u in floor}
    assert sorted(units - placed) == [], "place each in FLOORS"
    assert sorted(placed - units) == [], "FLOORS names what is not in bootstrap/"


def test_no_circle_inside_a_folder():
    circles = folder_cycles(module_arrows())
    assert not circles, "modules of one folder that import each other in a loop:\n" + \
        "\n".join(" <-> ".join(c) for c in circles)


@pytest.mark.parametrize("mod, extra, want", [
    # each arrow that ran back up before issue 50
    ("bootstrap.doctor.run", "bootstrap.doctor.run", None),  # the graph as it is: no back arrow from doctor
    ("bootstrap.signatures.engine", "bootstrap.doctor.run",
     "bootstrap.signatures.engine imports bootstrap.doctor.run: floors run one way"),
    ("bootstrap.nccl.network", "bootstrap.fleet.plan", "bootstrap.nccl.network imports bootstrap.fleet.plan"),
    ("bootstrap.fleet.plan", "bootstrap.monitor.plan", "bootstrap.fleet.plan imports bootstrap.monitor.plan"),
    # one floor: neither imports the other
    ("bootstrap.serve.split", "bootstrap.nccl.parse", "bootstrap.serve.split imports bootstrap.nccl.parse"),
    ("bootstrap.cluster.guard.fence", "bootstrap.inventory.fields",
     "bootstrap.cluster.guard.fence imports bootstrap.inventory.fields"),
    ("bootstrap.model", "bootstrap.errors", "bootstrap.model imports bootstrap.errors"),
])
def test_a_back_arrow_is_caught(mod, extra, want):
    graph = all_modules()
    graph[mod] = graph[mod] | {extra}
    found = back_arrows(graph)
    assert (not [f for f in found if f.startswith(mod + " ")]) if want is None else any(want in f for f in found), found


@pytest.mark.parametrize("mod, extra, want", [
    ("bootstrap.cluster.guard.allow", "bootstrap.cluster.guard.fence",
     ["bootstrap.cluster.guard.allow", "bootstrap.cluster.guard.fence"]),
    ("bootstrap.signatures.engine", "bootstrap.signatures.container",
     ["bootstrap.signatures.container", "bootstrap.signatures.engine"]),
    # through the package face: rootcause -> signatures/__init__ -> rootcause
    ("bootstrap.signatures.rootcause", "bootstrap.signatures",
     ["bootstrap.signatures", "bootstrap.signatures.rootcause"]),
    ("bootstrap.serve.run", "bootstrap.serve.run", ["bootstrap.serve.run"]),
])
def test_a_circle_inside_a_folder_is_caught(mod, extra, want):
    graph = module_arrows()
    graph[mod] = graph[mod] | {extra}
    assert want in folder_cycles(graph)


def test_a_circle_across_folders_is_no_folder_circle_but_a_back_arrow():
    graph = module_arrows()
    graph["bootstrap.cluster.facts"] = graph["bootstrap.cluster.facts"] | {"bootstrap.cluster.guard.run"}
    graph["bootstrap.cluster.guard.run"] = graph["bootstrap.cluster.guard.run"] | {"bootstrap.cluster.facts"}
    assert not [c for c in folder_cycles(graph) if "bootstrap.cluster.guard.run" in c]
    graph["bootstrap.remote.ssh"] = graph["bootstrap.remote.ssh"] | {"bootstrap.cluster.run"}
    assert any(f.startswith("bootstrap.remote.ssh imports bootstrap.cluster.run") for f in back_arrows(graph))


def test_the_pure_list_names_real_modules():
    graph = all_modules()
    for p in PURE:
        assert any(_under(m, p) for m in graph), p


@pytest.mark.parametrize("mod, extra, want", [
    ("bootstrap.serve.split", "bootstrap.remote.ssh", "pure bootstrap.serve.split reaches bootstrap.remote.ssh"),
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
    ("bootstrap.cluster.probe", "bootstrap.signatures",
     "bootstrap.cluster.probe reaches bootstrap.signatures (imported by bootstrap.cluster.probe)"),
    # ... and through another module: cluster.run -> cluster.probe -> signatures (doctor's, once)
    ("bootstrap.cluster.probe", "bootstrap.signatures.rules",
     "bootstrap.cluster.run reaches bootstrap.signatures.rules (imported by bootstrap.cluster.probe)"),
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


#: The size a reader can hold (issue 50): no module of the package over this many lines, no function over
#: FUNCTION_LINES (its whole body, decorators left out); complexity is ruff's C901 at 15 (pyproject.toml).
MODULE_LINES = 600
FUNCTION_LINES = 80


def sizes() -> tuple[list[str], list[str]]:
    """(modules over MODULE_LINES, functions over FUNCTION_LINES), each as 'path[:name]: lines'."""
    modules, functions = [], []
    for p in sorted(PKG.rglob("*.py")):
        text = p.read_text()
        rel = p.relative_to(PKG.parent)
        if text.count("\n") > MODULE_LINES:
            modules.append(f"{rel}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text, str(p))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > FUNCTION_LINES:
                    functions.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    return modules, functions


def test_no_module_over_600_lines():
    assert not sizes()[0], f"modules over {MODULE_LINES} lines (split by concern):\n" + "\n".join(sizes()[0])


def test_no_function_over_80_lines():
    assert not sizes()[1], f"functions over {FUNCTION_LINES} lines (one step each):\n" + "\n".join(sizes()[1])


def test_the_size_rules_can_fail(tmp_path, monkeypatch):
    pkg = tmp_path / "bootstrap"
    pkg.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(FUNCTION_LINES))
    (pkg / "big.py").write_text("def f():\n" + body + "\n" * MODULE_LINES)
    monkeypatch.setattr(sys.modules[__name__], "PKG", pkg)
    modules, functions = sizes()
    assert modules == [f"bootstrap/big.py: {FUNCTION_LINES + 1 + MODULE_LINES} lines"]
    assert functions == [f"bootstrap/big.py:1 f: {FUNCTION_LINES + 1} lines"]
