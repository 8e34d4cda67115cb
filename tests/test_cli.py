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


CORPUS = sorted((ROOT / "tests" / "inventory_corpus").glob("*.yaml"))


@pytest.mark.parametrize("source", CORPUS, ids=lambda p: p.stem)
def test_every_malformed_inventory_is_one_line_exit_2_through_the_cli(source, tmp_path, monkeypatch):
    from click.testing import CliRunner

    touched = []
    monkeypatch.setattr("bootstrap.transport.SSHHost.connect", lambda self: touched.append(self.name))

    key = tmp_path / "id_0644"
    key.write_text("not really a key\n")
    key.chmod(0o644)
    path = tmp_path / source.name
    raw = source.read_bytes()
    path.write_bytes(raw.replace(b"@KEY_0644@", str(key).encode()))
    expect = raw.split(b"\n")[0][len(b"# expect: "):].decode()
    for command in ("validate", "up", "down"):
        r = CliRunner().invoke(main, [command, "-i", str(path)], env={"HF_TOKEN": "hf_TOPSECRET"})
        assert r.exit_code == 2, r.output
        assert r.stdout == ""
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0]
        assert "Traceback" not in r.stderr and "hf_TOPSECRET" not in r.stderr
    assert touched == []  # no host was contacted


def test_shell_metacharacters_in_an_image_name_are_rejected_before_any_host(tmp_path):
    inv = tmp_path / "hosts.yaml"
    inv.write_text("cluster: {accelerator: none, image: 'vllm;touch /tmp/pwned'}\n"
                   "hosts: [{name: a, address: 192.0.2.1}]\n")
    r = run("up", "-i", str(inv))
    assert r.returncode == 2 and "cluster.image" in r.stderr and r.stderr.count("\n") == 1


def test_control_a_valid_inventory_does_reach_the_hosts(tmp_path, monkeypatch):
    """The positive control for the corpus test above: the connect probe does fire."""
    from click.testing import CliRunner

    from bootstrap.errors import HostUnreachable

    touched = []

    def connect(self):
        touched.append(self.name)
        raise HostUnreachable(self.name, "probe")
    monkeypatch.setattr("bootstrap.transport.SSHHost.connect", connect)
    inv = tmp_path / "ok.yaml"
    inv.write_text("cluster: {accelerator: none}\nhosts: [{name: a, address: 192.0.2.1}, {name: b, address: 192.0.2.2}]\n")
    r = CliRunner().invoke(main, ["up", "-i", str(inv)])
    assert r.exit_code == 3 and sorted(touched) == ["a", "b"], r.output
