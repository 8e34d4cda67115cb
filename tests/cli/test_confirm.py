"""`down` says what it removes and asks first (issue 51.1): [y/N] on a terminal, --yes where none can
answer; a "no", or no terminal without --yes, leaves every host as it was (no host is contacted)."""
from __future__ import annotations

import os
import pty
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def inv(tmp_path) -> Path:
    """Two hosts on loopback ports nothing listens on: contacting them fails at once (exit 3)."""
    (tmp_path / "known_hosts").write_text("")
    p = tmp_path / "hosts.yaml"
    p.write_text(f"cluster: {{name: prod-chat, accelerator: none, ssh: {{port: {free_port()}, known_hosts: "
                 f"{tmp_path}/known_hosts, connect_retries: 0, connect_timeout: 2}}}}\n"
                 "hosts: [{name: a, address: 127.0.0.1, ip: 192.0.2.10},\n"
                 "        {name: b, address: 127.0.0.2, ip: 192.0.2.11}]\n")
    return p


def on_a_terminal(argv: list[str], answer: bytes | None, timeout: float = 60) -> tuple[str, int]:
    """Run the CLI with a pseudo-terminal as stdin/stdout/stderr; type `answer` at the [y/N] prompt."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.chdir(ROOT)
        os.execvp(sys.executable, [sys.executable, "-m", "bootstrap", *argv])
    out, end, answered = b"", time.monotonic() + timeout, False
    while time.monotonic() < end:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
        if answer is not None and not answered and b"[y/N]" in out:
            os.write(fd, answer)
            answered = True
    _, status = os.waitpid(pid, 0)
    return out.decode(errors="replace").replace("\r\n", "\n"), os.waitstatus_to_exitcode(status)


def test_without_a_terminal_down_refuses_unless_yes_and_names_what_it_would_remove(inv):
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "bootstrap", "down", "-i", str(inv)], cwd=ROOT, capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "down removes the cluster 'prod-chat'" in lines[0] and "2 host(s): a (127.0.0.1), b (127.0.0.2)" in lines[0]
    assert str(inv) in lines[0] and "pass --yes" in lines[0]
    assert "cannot connect" not in r.stderr and time.monotonic() - t < 30  # no host was tried


def test_yes_goes_on_without_asking(inv):
    r = subprocess.run([sys.executable, "-m", "bootstrap", "down", "-i", str(inv), "--yes"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 3 and "cannot connect over SSH" in r.stderr, r.stderr  # it tried the hosts
    assert "[y/N]" not in r.stderr


def test_no_at_the_prompt_leaves_every_host_as_it_was(inv):
    out, rc = on_a_terminal(["down", "-i", str(inv)], b"n\n")
    assert rc == 1, out
    assert "down removes the cluster 'prod-chat'" in out and "Go on? [y/N]" in out
    assert "not confirmed: nothing was removed" in out and "cannot connect" not in out


def test_enter_at_the_prompt_is_no(inv):
    out, rc = on_a_terminal(["down", "-i", str(inv)], b"\n")
    assert rc == 1 and "nothing was removed" in out, out


def test_yes_at_the_prompt_goes_on(inv):
    out, rc = on_a_terminal(["down", "-i", str(inv)], b"y\n", timeout=120)
    assert rc != 2 and "cannot connect" in out, out  # went on to the hosts (none answers)


def test_serve_stop_says_what_it_stops_and_asks_first(inv):
    """`serve --stop` (issue 51.1): as down, one line naming the cluster, its head and the inventory
    without a terminal (no host contacted); on a terminal a "no" stops nothing; --yes goes on."""
    r = subprocess.run([sys.executable, "-m", "bootstrap", "serve", "-i", str(inv), "--stop"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "serve --stop stops vLLM on the cluster 'prod-chat' (head a; Ray keeps running)" in r.stderr
    assert str(inv) in r.stderr and "pass --yes" in r.stderr and "cannot connect" not in r.stderr
    out, rc = on_a_terminal(["serve", "-i", str(inv), "--stop"], b"n\n")
    assert rc == 1 and "Go on? [y/N]" in out and "cannot connect" not in out, out
    r = subprocess.run([sys.executable, "-m", "bootstrap", "serve", "-i", str(inv), "--stop", "--yes"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 3 and "cannot connect over SSH" in r.stderr, r.stderr


def _typed_at(argv: list[str], prompt: bytes, answer: bytes, timeout: float = 60) -> tuple[str, int, int]:
    """Run the CLI on a pseudo-terminal and type `answer` at each `prompt`: (output, exit code, prompts seen)."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.chdir(ROOT)
        os.execvp(sys.executable, [sys.executable, "-m", "bootstrap", *argv])
    out, end, seen = b"", time.monotonic() + timeout, 0
    while time.monotonic() < end:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
        if out.count(prompt) > seen:
            seen = out.count(prompt)
            os.write(fd, answer)
    _, status = os.waitpid(pid, 0)
    return out.decode(errors="replace").replace("\r\n", "\n"), os.waitstatus_to_exitcode(status), seen


@pytest.mark.parametrize("where", ["after", "before"])
def test_K_asks_the_sudo_password_once_without_echo_then_goes_on(inv, where):
    """-K (issue 63) asks once at a terminal, as Ansible's does, before or after the command's name; the
    password typed is not echoed, and the command goes on to the hosts (here: none answers)."""
    argv = ["status", "-K", "-i", str(inv)] if where == "after" else ["-K", "status", "-i", str(inv)]
    out, rc, prompts = _typed_at(argv, b"BECOME password: ", b"Typed-pw-7\n")
    assert prompts == 1 and "Typed-pw-7" not in out, out
    # went on to the hosts (none answers): status marks them unreachable (its note column may wrap "cannot connect")
    assert rc != 2 and "unreachable" in out, out


def test_K_without_a_terminal_names_the_variable_for_scripts(inv):
    r = subprocess.run([sys.executable, "-m", "bootstrap", "status", "-K", "-i", str(inv)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "no terminal to ask for the sudo password: set $BOOTSTRAP_BECOME_PASSWORD" in r.stderr
    assert "cannot connect" not in r.stderr  # no host was tried


def test_monitor_down_purge_says_what_it_deletes_and_asks_first(inv):
    """`monitor down --purge` deletes Prometheus' stored samples (issue 67): as down, one line naming the
    volume, its host and the inventory without a terminal (no host contacted); a "no" on a terminal
    deletes nothing; --yes goes on; plain `monitor down` (nothing deleted that cannot come back) asks nothing."""
    r = subprocess.run([sys.executable, "-m", "bootstrap", "monitor", "down", "-i", str(inv), "--purge"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert ("monitor down --purge deletes the cluster 'prod-chat''s stored Prometheus samples (the volume "
            "bootstrap-vllm-prometheus-data on a)") in r.stderr, r.stderr
    assert str(inv) in r.stderr and "pass --yes" in r.stderr and "cannot connect" not in r.stderr
    out, rc = on_a_terminal(["monitor", "down", "-i", str(inv), "--purge"], b"n\n")
    assert rc == 1 and "Go on? [y/N]" in out and "nothing was removed" in out and "cannot connect" not in out, out
    for argv in (["--purge", "--yes"], []):
        r = subprocess.run([sys.executable, "-m", "bootstrap", "monitor", "down", "-i", str(inv), *argv], cwd=ROOT,
                           capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert r.returncode == 3 and "cannot connect over SSH" in r.stderr, (argv, r.stderr)
