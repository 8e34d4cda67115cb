"""The scripts under checks/ (run inside containers, standard library only) loaded as modules, so
that unit tests call their functions on captured input."""
from __future__ import annotations

import importlib.util
import pathlib
import types

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"


def load_check(name: str) -> types.ModuleType:
    """checks/<name>.py as a fresh module."""
    spec = importlib.util.spec_from_file_location(f"check_{name}", ROOT / "checks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
