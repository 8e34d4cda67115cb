"""The scripts under checks/ (run inside containers, standard library only) loaded as modules, so
that unit tests call their functions on captured input."""
from __future__ import annotations

import importlib.util
import pathlib
import types

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"


def _load(name: str, path: pathlib.Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_check(name: str) -> types.ModuleType:
    """checks/<name>.py as a fresh module."""
    return _load(f"check_{name}", ROOT / "checks" / f"{name}.py")


def docs_page(name: str) -> tuple[types.ModuleType, str, str]:
    """(docs/hooks.py as a module, docs/<name> as written, as the site shows it after the hook)."""
    hooks = _load("docs_hooks", ROOT / "docs" / "hooks.py")
    page = (ROOT / "docs" / name).read_text()
    return hooks, page, hooks.on_page_markdown(page, None, None, None)
