"""The package map of docs/architecture.md is the one docs/hooks.py makes from the modules' docstrings
(`python3 docs/hooks.py` writes it afresh): every module of bootstrap/ stands in it with the first
sentence of its docstring, and a module without one fails here."""
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
hooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hooks)


def page_map() -> str:
    page = hooks.ARCHITECTURE.read_text()
    return page[page.index(hooks.MARK_MAP) + len(hooks.MARK_MAP):page.index(hooks.MARK_MAP_END)].strip()


def test_the_page_holds_the_map_made_afresh():
    assert page_map() == hooks.package_map(), "docs/architecture.md's package map is stale: run python3 docs/hooks.py"


def test_every_module_of_the_package_stands_in_the_map():
    listed = {path for _, _, path in hooks.map_entries(ROOT / "bootstrap")}
    assert listed == set((ROOT / "bootstrap").rglob("*.py")) - {p for p in (ROOT / "bootstrap").rglob("*.py")
                                                               if "__pycache__" in p.parts}
    text = " ".join(page_map().split())
    for _, _, path in hooks.map_entries(ROOT / "bootstrap"):
        assert " ".join(hooks.summary(path).split()) in text, path


def test_every_module_says_what_it_is_for():
    bare = []
    for p in sorted((ROOT / "bootstrap").rglob("*.py")):
        try:
            hooks.summary(p)
        except ValueError as exc:
            bare.append(str(exc))
    assert bare == []


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "bootstrap"
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    return pkg


def test_a_module_without_a_docstring_first_line_fails(tmp_path):
    pkg = _package(tmp_path, {"__init__.py": '"""The package."""\n', "plain.py": "X = 1\n"})
    with pytest.raises(ValueError, match=r"plain\.py: no docstring first line"):
        hooks.package_map(pkg)
    (pkg / "plain.py").write_text('"""   \n   """\nX = 1\n')  # a docstring of blanks
    with pytest.raises(ValueError, match="no docstring first line"):
        hooks.package_map(pkg)


def test_the_map_is_the_first_sentence_by_folder_and_a_stale_page_is_seen(tmp_path):
    pkg = _package(tmp_path, {
        "__init__.py": '"""The package."""\n',
        "zeta.py": '"""Zeta, pure: the last by name.\n\nNot in the map."""\n',
        "alpha/__init__.py": '"""Alpha: a folder of its own.\nIts second sentence. More."""\n',
        "alpha/run.py": '"""Run alpha over SSH."""\n',
    })
    block = hooks.package_map(pkg)
    assert [re.sub(r"(?<=\S)\s{2,}", " | ", ln) for ln in block.splitlines()[1:-1]] == [
        "bootstrap/ | The package.", "  alpha/ | Alpha: a folder of its own.", "    run.py | Run alpha over SSH.",
        "  zeta.py | Zeta, pure: the last by name."]
    page = f"# A\n\n{hooks.MARK_MAP}\nA STALE MAP\n{hooks.MARK_MAP_END}\n\nafter\n"
    fresh = hooks.with_package_map(page, pkg)
    assert "STALE" not in fresh and block in fresh and fresh.endswith(f"{hooks.MARK_MAP_END}\n\nafter\n")
    assert hooks.with_package_map(fresh, pkg) == fresh
