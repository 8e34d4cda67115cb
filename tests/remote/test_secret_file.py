"""The 0600 secret env file: a removal that fails is an error naming the host and the file, never a
silent leftover; with the `docker run` already failed, that error stays first and the removal
failure rides along as a note. SFTP is faked (tests/support/fake_hosts.py): no socket is opened."""
from __future__ import annotations

import errno
from types import SimpleNamespace

import paramiko
import pytest

from bootstrap.errors import CommandFailed, GroupError, RemoteFileLeft, notes_of
from bootstrap.model import Host, SSHSettings, SSHTarget
from bootstrap.remote.ssh import SSHHost
from tests.support.fake_hosts import FakeConn, FakeSFTP

SECRET = b"HF_TOKEN=hf_TopSecretValue123\n"


def host(sftp: FakeSFTP, name: str = "gpu-a") -> SSHHost:
    s = SSHHost(Host(name, SSHTarget("10.0.0.1"), ip="10.0.0.1", role="head"), SSHSettings())
    s._conn = FakeConn(sftp)  # never connects: the fake answers the SFTP calls
    return s


def denied() -> OSError:
    return PermissionError(errno.EACCES, "Permission denied")


def test_a_removal_that_fails_names_the_host_and_the_file():
    s = host(FakeSFTP(remove_error=denied()))
    with pytest.raises(RemoteFileLeft) as ei:
        s.remove_file("/tmp/.bootstrap-0123", what="the secret env file")
    text = str(ei.value)
    assert ei.value.host == "gpu-a" and ei.value.path == "/tmp/.bootstrap-0123"
    assert "gpu-a" in text and "/tmp/.bootstrap-0123" in text and "Permission denied" in text
    assert "the secret env file" in text and "rm -f /tmp/.bootstrap-0123" in text


@pytest.mark.parametrize("lost", [paramiko.SSHException("Channel closed."), EOFError()])
def test_a_connection_lost_before_the_removal_is_the_same_error(lost):
    with pytest.raises(RemoteFileLeft, match="gpu-a: could not remove the file /tmp/x"):
        host(FakeSFTP(remove_error=lost)).remove_file("/tmp/x")


@pytest.mark.parametrize("gone", [FileNotFoundError(errno.ENOENT, "No such file"),
                                  IOError(errno.ENOENT, "No such file")])
def test_a_file_already_gone_is_not_an_error(gone):
    host(FakeSFTP(remove_error=gone)).remove_file("/tmp/x")  # nothing left on disk: nothing to say


def test_private_file_is_0600_and_removed_after_the_body():
    sftp = FakeSFTP()
    with host(sftp).private_file(SECRET) as path:
        assert sftp.files[path] == SECRET and sftp.modes[path] == 0o600
    assert path in sftp.removed and path not in sftp.files


def test_private_file_raises_the_removal_failure_when_the_body_succeeded():
    sftp = FakeSFTP(remove_error=denied())
    with pytest.raises(RemoteFileLeft) as ei:
        with host(sftp).private_file(SECRET) as path:
            pass
    assert path in str(ei.value) and "gpu-a" in str(ei.value)
    assert "hf_TopSecretValue123" not in str(ei.value)


def test_a_failed_run_stays_the_error_and_the_removal_failure_is_attached():
    sftp = FakeSFTP(remove_error=denied())
    run_failed = CommandFailed("gpu-a", "docker run ...", 125, "docker: invalid reference format")
    with pytest.raises(CommandFailed) as ei:
        with host(sftp).private_file(SECRET) as path:
            raise run_failed
    assert ei.value is run_failed and ei.value.exit_code == 125  # not masked, exit status kept
    notes = notes_of(ei.value)
    assert len(notes) == 1 and path in notes[0] and "gpu-a" in notes[0] and "could not remove" in notes[0]
    assert "hf_TopSecretValue123" not in notes[0]


def test_a_write_that_fails_part_way_removes_what_landed_and_names_host_and_file():
    sftp = FakeSFTP(write_error=OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(CommandFailed) as ei:
        host(sftp).put_private_file(SECRET, what="the secret env file")
    text = str(ei.value)
    assert sftp.removed and not sftp.files  # the half-written secret is gone
    assert ei.value.host == "gpu-a" and sftp.removed[0] in text and "No space left on device" in text
    assert "hf_TopSecretValue123" not in text and not notes_of(ei.value)


def test_a_write_and_a_removal_that_both_fail_say_both():
    sftp = FakeSFTP(write_error=paramiko.SSHException("Server connection dropped"), remove_error=EOFError())
    with pytest.raises(CommandFailed) as ei:
        host(sftp).put_private_file(SECRET)
    assert "Server connection dropped" in str(ei.value)
    assert any(sftp.removed[0] in n and "could not remove" in n for n in notes_of(ei.value))


# -- the callers: `up`'s docker run and the fleet's docker create ------------------------------------
def _up_action():
    from bootstrap.cluster.run import start_container

    spec = SimpleNamespace(name="vllm-node", secret_names=("HF_TOKEN",),
                           run_argv=lambda env_file: ("docker", "run", "--env-file", env_file, "img"))
    action = SimpleNamespace(host="gpu-a", action="create", spec=spec)
    secret = SimpleNamespace(name="HF_TOKEN", reveal=lambda: "hf_TopSecretValue123")
    return start_container, action, secret


def _sess(s: SSHHost, secret) -> SimpleNamespace:
    return SimpleNamespace(ssh={"gpu-a": s}, inv=SimpleNamespace(cluster=SimpleNamespace(secrets=(secret,))),
                           run_times={})


def test_up_reports_an_env_file_it_could_not_remove_after_a_good_run(monkeypatch):
    start_container, action, secret = _up_action()
    sftp = FakeSFTP(remove_error=denied())
    s = host(sftp)
    ran = []
    monkeypatch.setattr(s, "run", lambda argv, **kw: ran.append(argv))
    with pytest.raises(RemoteFileLeft) as ei:
        start_container(_sess(s, secret), action)
    assert ran and ran[0][3] == ei.value.path and ei.value.host == "gpu-a"


def test_up_keeps_the_run_error_and_attaches_the_removal_failure(monkeypatch):
    start_container, action, secret = _up_action()
    s = host(FakeSFTP(remove_error=denied()))
    failed = CommandFailed("gpu-a", "docker run ...", 125, "Conflict. The container name is already in use")

    def run(argv, **kw):
        raise failed
    monkeypatch.setattr(s, "run", run)
    with pytest.raises(CommandFailed) as ei:
        start_container(_sess(s, secret), action)
    assert ei.value is failed and any("could not remove" in n and "gpu-a" in n for n in notes_of(failed))


def test_the_fleets_docker_create_reports_an_env_file_it_could_not_remove(monkeypatch):
    from bootstrap.fleet.run import _run_with_env_file

    s = host(FakeSFTP(remove_error=denied()))
    monkeypatch.setattr(s, "run", lambda argv, **kw: None)
    sess = SimpleNamespace(ssh={"gpu-a": s})
    with pytest.raises(RemoteFileLeft, match="gpu-a: could not remove the secret env file /tmp/.bootstrap-"):
        _run_with_env_file(sess, SimpleNamespace(name="gpu-a"), ("docker", "create", "--env-file", "-", "img"),
                           "VLLM_API_KEY=sk-secret\n")


def test_the_cli_prints_an_attached_failure_under_the_error(capsys):
    from bootstrap.cli import _fail
    from bootstrap.errors import add_note

    run = CommandFailed("gpu-a", "docker run ...", 125, "boom")
    add_note(run, "gpu-a: could not remove the secret env file /tmp/.bootstrap-1: Permission denied")
    with pytest.raises(SystemExit) as e:
        _fail(GroupError("start-head", {"gpu-a": run}))
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert "also: gpu-a: could not remove the secret env file /tmp/.bootstrap-1" in err
