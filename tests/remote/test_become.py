"""run_as_root's remote half (remote/become.py BECOME), run here with stand-ins for `id` and `sudo` on PATH:
the password is read from the first line of stdin and reaches sudo's askpass program only, once; the
command gets the rest of stdin and never the password; without a password, `sudo -n`; as root, no
sudo at all. (The real sudo, asking a real password over a real sshd, is the mixed rack's sandbox
test: tests/sandbox/test_sandbox_serve.py.)"""
import os
import subprocess

from bootstrap.remote import become as B

#: A sudo that asks through SUDO_ASKPASS (as `sudo -A` does) when it is told to ask, and records what
#: it saw: its argv and the password its askpass gave (asked twice: the second must fail).
FAKE_SUDO = r"""#!/bin/sh
log="$FAKE_LOG"
printf 'argv:%s\n' "$*" >> "$log"
if [ "$1" = -n ]; then shift; [ "$FAKE_NEEDS_PW" = 1 ] && { echo "sudo: a password is required" >&2; exit 1; }
  [ "$1" = -- ] && shift; exec "$@"; fi
[ "$1" = -A ] || exit 99
shift; [ "$1" = -p ] && shift 2; [ "$1" = -- ] && shift
if [ "$FAKE_NEEDS_PW" = 1 ]; then
  got=$("$SUDO_ASKPASS" prompt) || { echo "sudo: no password was provided" >&2; exit 1; }
  again=$("$SUDO_ASKPASS" prompt) && echo "askpass answered twice" >> "$log"
  printf 'askpass:%s\n' "$got" >> "$log"
  [ "$got" = "$FAKE_PASSWORD" ] || { echo "sudo: 1 incorrect password attempt" >&2; exit 1; }
fi
unset BOOTSTRAP_ASKPASS_VALUE BOOTSTRAP_ASKPASS_ONCE SUDO_ASKPASS  # sudo's env_reset
exec "$@"
"""


def _bin(tmp_path, uid):
    b = tmp_path / "bin"
    b.mkdir()
    (b / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (b / "sudo").write_text(FAKE_SUDO)
    for f in b.iterdir():
        f.chmod(0o755)
    return b


def _run(tmp_path, uid, mode, stdin, argv, **env):
    tmp_path = tmp_path / f"{mode}-{uid}"
    tmp_path.mkdir()
    b = _bin(tmp_path, uid)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    log = tmp_path / "log"
    log.write_text("")
    full = {"PATH": f"{b}:/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(tmp_path), "FAKE_LOG": str(log),
            **env}
    r = subprocess.run(["sh", "-c", B.BECOME, "sh", mode, *argv], input=stdin, capture_output=True, env=full,
                       timeout=30)
    return r, log.read_text(), home


def test_the_password_reaches_only_sudos_askpass_once_and_the_command_gets_the_rest_of_stdin(tmp_path):
    pw = "S3cret pw with 'quotes' and $dollar"
    r, log, home = _run(tmp_path, 1000, "pw", (pw + "\npayload line\n").encode(), ["sh", "-c", "cat; echo done"],
                        FAKE_NEEDS_PW="1", FAKE_PASSWORD=pw)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() == "payload line\ndone\n"  # the password is not on the command's stdin
    assert f"askpass:{pw}\n" in log and "answered twice" not in log, log
    argv_line = next(ln for ln in log.splitlines() if ln.startswith("argv:"))
    assert pw not in argv_line and argv_line.startswith("argv:-A -p ")
    askpass = home / ".bootstrap" / "askpass"
    assert oct(askpass.stat().st_mode & 0o777) == "0o700" and pw not in askpass.read_text()
    assert not [p for p in os.listdir(tmp_path / "pw-1000") if p.startswith("bootstrap-askpass.")]  # marker gone


def test_a_wrong_password_is_one_attempt_with_sudos_own_line(tmp_path):
    r, log, _ = _run(tmp_path, 1000, "pw", b"wrong\n", ["true"], FAKE_NEEDS_PW="1", FAKE_PASSWORD="right")
    assert r.returncode == 1 and b"1 incorrect password attempt" in r.stderr
    assert log.count("askpass:") == 1 and "answered twice" not in log


def test_without_a_password_sudo_n_and_as_root_no_sudo(tmp_path):
    r, log, _ = _run(tmp_path, 1000, "n", b"in\n", ["cat"])
    assert (r.returncode, r.stdout, log) == (0, b"in\n", "argv:-n -- cat\n")
    r, log, _ = _run(tmp_path, 0, "pw", b"pw\nrest\n", ["cat"])
    assert (r.returncode, r.stdout, log) == (0, b"rest\n", "")  # root: the password line dropped, no sudo
