"""The documentation site built once for a test module (tests/docs): mkdocs build --strict."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def build_site(out: Path) -> Path:
    """Build the site into OUT (a strict build: a broken link, anchor or page fails the test)."""
    pytest.importorskip("mkdocs", reason="the docs extra (pip install '.[docs]'); scripts/dev-setup.sh installs it")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return out
