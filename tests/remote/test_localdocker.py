"""This machine's Docker through the SDK (bootstrap/remote/localdocker.py), and `up --load-image`'s
fan-out of one `docker save` stream to every host (bootstrap/cluster/imagedist/run.py load_image).

The fan-out tests need no Docker (the save stream and the hosts are fakes); the ones that ask the
daemon are skipped without one."""
from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import threading
import time
from dataclasses import dataclass

import pytest

from bootstrap.cluster.imagedist import run as IM
from bootstrap.containers import image_content_key
from bootstrap.errors import CommandFailed, GroupError, PreflightFailed
from bootstrap.remote import localdocker as LD
from bootstrap.remote.session import Session, Timings
from tests.conftest import require_docker


@pytest.fixture
def needs_docker():
    """A running Docker engine: a failure under BOOTSTRAP_REQUIRE_SANDBOX=1 (CI), else a skip."""
    require_docker()


# --- the fan-out, with fakes ---------------------------------------------------------------------


class FakeSSH:
    def __init__(self, name: str, *, fail_after: int | None = None, delay: float = 0.0):
        self.name, self.fail_after, self.delay = name, fail_after, delay
        self.got = bytearray()
        self.argv = None

    def run_with_input(self, argv, chunks, **_kw):
        self.argv = argv
        for i, chunk in enumerate(chunks):
            if self.fail_after is not None and i >= self.fail_after:
                raise CommandFailed(self.name, "docker load --quiet", 1, "no space left on device")
            time.sleep(self.delay)
            self.got += chunk


class FakeSession:
    """What load_image uses of a Session: its stage() (the real one), ssh, timings, parallel, cancel."""

    stage = Session.stage

    def __init__(self, ssh: dict[str, FakeSSH], parallel: int = 32):
        self.ssh, self.parallel = ssh, parallel
        self.timings = Timings()
        self.cancel = threading.Event()
        self.clock = time.monotonic
        self.current_stage = ""
        self.events: list[tuple[str, str, str]] = []
        self.reporter = self

    def event(self, host, stage, status, detail=""):
        self.events.append((host, stage, status))


@dataclass(frozen=True)
class FakeHost:
    """All load_image and Session.stage read of a Host."""

    name: str


def hosts(n: int) -> list[FakeHost]:
    return [FakeHost(f"node{i}") for i in range(1, n + 1)]


@pytest.fixture
def fake_save(monkeypatch):
    """LD.save replaced by a stream of numbered chunks; counts the streams opened and closed."""
    state = {"opened": 0, "closed": 0, "chunks": 40, "break_at": None, "missing": False}

    def save(image, chunk_size=LD.SAVE_CHUNK):
        state["opened"] += 1
        try:
            if state["missing"]:
                raise CommandFailed("localhost", f"docker save {image}", 1, "reference does not exist")
            for i in range(state["chunks"]):
                if state["break_at"] == i:
                    raise CommandFailed("localhost", f"docker save {image}", 1, "unexpected EOF")
                yield bytes([i % 256]) * 1000
        finally:
            state["closed"] += 1

    monkeypatch.setattr(LD, "save", save)

    def no_tempfiles(*a, **kw):
        raise AssertionError("load_image must not write the image to disk")
    monkeypatch.setattr("tempfile.TemporaryDirectory", no_tempfiles)
    monkeypatch.setattr("tempfile.mkstemp", no_tempfiles)
    return state


def expected(n: int) -> bytes:
    return b"".join(bytes([i % 256]) * 1000 for i in range(n))


def run_with_deadline(fn, seconds: float = 30):
    """Run fn in a thread; fail (instead of hanging the suite) when it does not return in time."""
    out: dict = {}

    def go():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            out["error"] = exc
    th = threading.Thread(target=go, daemon=True)
    th.start()
    th.join(seconds)
    assert not th.is_alive(), f"load_image did not return within {seconds}s (a host held up the others?)"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def test_one_save_stream_reaches_every_host_whole(fake_save):
    ssh = {h.name: FakeSSH(h.name) for h in hosts(3)}
    sess = FakeSession(ssh)
    run_with_deadline(lambda: IM.load_image(sess, hosts(3), "img:1", queue_chunks=2))
    assert fake_save["opened"] == 1 and fake_save["closed"] == 1  # read once for all three
    assert all(bytes(s.got) == expected(40) for s in ssh.values())
    assert all(s.argv == ("docker", "load", "--quiet") for s in ssh.values())
    assert "save" in sess.timings.stages and "load-image" in sess.timings.stages
    assert {(h, st) for h, _, st in sess.events} >= {(f"node{i}", "done") for i in (1, 2, 3)}


def test_a_failing_host_drops_out_and_the_others_get_everything(fake_save):
    ssh = {"node1": FakeSSH("node1"), "node2": FakeSSH("node2", fail_after=2), "node3": FakeSSH("node3", delay=0.002)}
    sess = FakeSession(ssh)
    with pytest.raises(GroupError) as err:
        run_with_deadline(lambda: IM.load_image(sess, hosts(3), "img:1", queue_chunks=2))
    assert set(err.value.failures) == {"node2"} and "no space left" in str(err.value)
    assert err.value.stage == "load-image"
    assert bytes(ssh["node1"].got) == expected(40) and bytes(ssh["node3"].got) == expected(40)
    assert fake_save["opened"] == fake_save["closed"] == 1


def test_when_every_host_fails_the_save_stream_is_closed_early(fake_save):
    fake_save["chunks"] = 10_000
    ssh = {h.name: FakeSSH(h.name, fail_after=1) for h in hosts(2)}
    with pytest.raises(GroupError):
        run_with_deadline(lambda: IM.load_image(FakeSession(ssh), hosts(2), "img:1", queue_chunks=2))
    deadline = time.monotonic() + 5
    while fake_save["closed"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fake_save["closed"] == 1


def test_a_missing_local_image_fails_naming_localhost_before_any_host(fake_save):
    fake_save["missing"] = True
    sess = FakeSession({"node1": FakeSSH("node1")})
    with pytest.raises(CommandFailed) as err:
        IM.load_image(sess, hosts(1), "img:1")
    assert err.value.host == "localhost" and "docker save img:1" in str(err.value)
    assert sess.events == []


def test_a_save_stream_that_breaks_fails_every_host_with_the_save_error(fake_save):
    fake_save["break_at"] = 5
    ssh = {h.name: FakeSSH(h.name) for h in hosts(2)}
    with pytest.raises(GroupError) as err:
        run_with_deadline(lambda: IM.load_image(FakeSession(ssh), hosts(2), "img:1", queue_chunks=2))
    assert set(err.value.failures) == {"node1", "node2"}
    assert all(e.host == "localhost" and "unexpected EOF" in str(e) for e in err.value.failures.values())


def test_more_hosts_than_parallel_read_one_stream_per_group(fake_save):
    ssh = {h.name: FakeSSH(h.name) for h in hosts(5)}
    run_with_deadline(lambda: IM.load_image(FakeSession(ssh, parallel=2), hosts(5), "img:1", queue_chunks=2))
    assert fake_save["opened"] == 3  # groups of 2, 2, 1: each host of a group is loading at once
    assert all(bytes(s.got) == expected(40) for s in ssh.values())


# --- the daemon -----------------------------------------------------------------------------------


def test_an_unreachable_daemon_is_one_preflight_error_naming_localhost(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    monkeypatch.setattr(LD, "_clients", {})
    with pytest.raises(LD.DockerUnavailable) as err:
        LD.image_id("anything")
    assert isinstance(err.value, PreflightFailed) and err.value.host == "localhost"
    assert str(err.value).startswith("localhost: cannot reach this machine's Docker daemon: ")
    assert "DOCKER_HOST" in str(err.value)
    with pytest.raises(PreflightFailed):
        IM.local_image_key("anything")


def test_image_id_and_save_of_a_local_image(needs_docker, tmp_path):
    name = f"bootstrap-test/localdocker:{os.getpid()}"
    layer = tmp_path / "layer.tar"
    with tarfile.open(layer, "w") as tar:
        info = tarfile.TarInfo("hello")
        data = os.urandom(3 << 20)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    subprocess.run(["docker", "import", str(layer), name], check=True, capture_output=True)
    try:
        inspect = json.loads(subprocess.run(["docker", "image", "inspect", name], check=True, capture_output=True,
                                            text=True).stdout)[0]
        assert LD.image_id(name) == inspect["Id"]
        # up --load-image compares this machine's image with the hosts' by content (facts.image_key)
        assert LD.image_key(name) == IM.local_image_key(name) == image_content_key(inspect) is not None
        assert LD.image_id(name + "-missing") is None and IM.local_image_key(name + "-missing") is None
        chunks = list(LD.save(name, chunk_size=1 << 20))
        assert all(len(c) >= 1 << 20 for c in chunks[:-1])  # gathered to the chunk size
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            manifest = json.load(tar.extractfile("manifest.json"))
        assert manifest[0]["RepoTags"] == [name]  # named, so `docker load` tags it
        with pytest.raises(CommandFailed) as err:
            next(LD.save(name + "-missing"))
        assert err.value.host == "localhost" and f"docker save {name}-missing" in str(err.value)
    finally:
        subprocess.run(["docker", "rmi", "-f", name], capture_output=True)
