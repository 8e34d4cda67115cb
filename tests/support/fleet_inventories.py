"""Shared by several test modules (moved from tests/test_fleet_pure.py)."""
from __future__ import annotations

import pathlib
import textwrap

import pytest

from bootstrap.errors import InventoryError
from bootstrap.inventory import load_inventory
from bootstrap.model import Inventory

TOKEN = "hf_TopSecretValue123"


ENVIRON = {"HF_TOKEN": TOKEN}


def write(tmp_path: pathlib.Path, text: str, name: str = "inventory.yaml") -> pathlib.Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def load(tmp_path: pathlib.Path, text: str, environ=None, **kw) -> Inventory:
    kw.setdefault("check_files", False)
    return load_inventory(write(tmp_path, text), ENVIRON if environ is None else environ, **kw)


def error(tmp_path: pathlib.Path, text: str, environ=None, **kw) -> InventoryError:
    with pytest.raises(InventoryError) as info:
        load(tmp_path, text, environ, **kw)
    return info.value


def hosts_yaml(n: int, extra: dict[int, str] | None = None) -> str:
    """`n` CPU hosts h0..h{n-1} at 10.0.0.1.., host i with `extra[i]` added to its flow mapping."""
    extra = extra or {}
    lines = ["hosts:"]
    for i in range(n):
        more = f", {extra[i]}" if i in extra else ""
        lines.append(f"  - {{name: h{i}, address: 10.0.0.{i + 1}{more}}}")
    return "\n".join(lines) + "\n"


def fleet_yaml(n: int = 4, replicas: int = 2, cluster: str = "", extra: dict[int, str] | None = None) -> str:
    """A CPU inventory of `n` hosts and `replicas` replicas; `cluster` is added (block style, 2 spaces)."""
    head = f"cluster:\n  accelerator: none\n  replicas: {replicas}\n"
    more = textwrap.indent(textwrap.dedent(cluster).strip("\n"), "  ") + "\n" if cluster else ""
    return head + more + hosts_yaml(n, extra)


def names(group) -> list[str]:
    return [h.name for h in group]


def line_of(path: pathlib.Path, needle: str) -> int:
    """The 1-based line of the first line of `path` that contains `needle`."""
    return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if needle in text)


def check(err: InventoryError, path: pathlib.Path, line: int, field: str, *parts: str) -> None:
    text = str(err)
    assert text.startswith(f"{path}:{line}: {field}: "), text
    assert err.line == line and err.path == str(path), text
    assert "\n" not in text and TOKEN not in text
    for part in parts:
        assert part in text, (part, text)
