"""The CLI as a user meets it: help everywhere, documented commands, one-line errors, exit codes."""
import subprocess
import sys
from pathlib import Path

import click
import pytest

from bootstrap.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def commands(group=main, prefix=()):
    for name, cmd in group.commands.items():
        path = prefix + (name,)
        if isinstance(cmd, click.Group):
            yield from commands(cmd, path)
        else:
            yield path, cmd


@pytest.mark.parametrize("path,cmd", list(commands()), ids=lambda x: " ".join(x) if isinstance(x, tuple) else "")
def test_every_command_has_help_with_an_example_and_is_in_the_readme(path, cmd):
    assert cmd.help and "Example:" in cmd.help, path
    assert f"bootstrap {' '.join(path)}" in README, path


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "bootstrap.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, env=env, timeout=60)


def test_missing_inventory_is_one_line_exit_2(tmp_path):
    r = run("validate", "-i", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "nope.yaml" in r.stderr and "Traceback" not in r.stderr


def test_example_inventories_validate_offline_in_plan():
    for f in ("inventory/example.yaml", "inventory/ansible-hosts.yaml"):
        r = run("plan", "-i", f, "--json")
        assert r.returncode == 0, r.stderr
        assert "VLLM_HOST_IP=10.10.0.11" in r.stdout
