"""The CLI package imports nothing of the library but its face (bootstrap.face), its own modules and
bootstrap.errors: every command is one call to the face (issue 50.4). Checked on the source with an
AST walk, imports inside functions included."""
from __future__ import annotations

import ast
from pathlib import Path

CLI = Path(__file__).resolve().parents[2] / "bootstrap" / "cli"
ALLOWED = ("bootstrap.face", "bootstrap.cli", "bootstrap.errors")


def _allowed(name: str) -> bool:
    return any(name == a or name.startswith(a + ".") for a in ALLOWED)


def bootstrap_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a bootstrap module in the file (`from bootstrap import x`: bootstrap.x)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "bootstrap"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: inside bootstrap.cli
                base = "bootstrap.cli" + ("." + node.module if node.module else "")
                found.append((node.lineno, base))
            elif node.module == "bootstrap":
                found += [(node.lineno, f"bootstrap.{a.name}") for a in node.names]
            elif node.module and node.module.split(".")[0] == "bootstrap":
                found.append((node.lineno, node.module))
    return found


def test_the_cli_imports_only_the_face_its_own_modules_and_the_errors():
    files = sorted(CLI.glob("*.py"))
    assert files and CLI / "__init__.py" in files
    bad = [f"{p.name}:{line} imports {mod}" for p in files for line, mod in bootstrap_imports(p) if not _allowed(mod)]
    assert not bad, "bootstrap/cli may import only " + ", ".join(ALLOWED) + ":\n" + "\n".join(bad)


def test_the_walk_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("def go():\n    from bootstrap.serve import run as V\n    import bootstrap.fleet.run\n"
                 "from bootstrap import face, sandbox\n")
    assert sorted(m for _, m in bootstrap_imports(f)) == ["bootstrap.face", "bootstrap.fleet.run",
                                                          "bootstrap.sandbox", "bootstrap.serve"]
    assert sorted(m for _, m in bootstrap_imports(f) if not _allowed(m)) == ["bootstrap.fleet.run", "bootstrap.sandbox",
                                                                           "bootstrap.serve"]
