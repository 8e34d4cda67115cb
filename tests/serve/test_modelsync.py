"""serve --sync-model's copy: the sender (checks/image_seed.py fed by tar) and the receiver (bash's
/dev/tcp into checks/model_stream.py) over real loopback sockets with real tar, and the refusal of a
stream whose digest is not the sender's."""
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from bootstrap.cluster import imagecopy as IC
from bootstrap.errors import PreflightFailed
from bootstrap.model import Host, SSHTarget
from bootstrap.serve import modelsync as MS
from bootstrap.serve import plan as P

CHECKS = Path(__file__).resolve().parents[2] / "checks"
STREAM = CHECKS / "model_stream.py"


def _model(root: Path) -> Path:
    d = root / "model"
    (d / "sub").mkdir(parents=True)
    (d / "config.json").write_text('{"model_type": "opt"}')
    (d / "model.safetensors").write_bytes(os.urandom(3_000_000))
    (d / "sub" / "tokenizer.json").write_text("{}" * 1000)
    return d


def _sums(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def _tar(d: Path) -> bytes:
    return subprocess.run(["tar", "-C", str(d), f"--exclude=./{MS.INCOMING}", "-cf", "-", "."],
                          capture_output=True, check=True).stdout


def _stream(mode: str, d: Path, data: bytes = b"") -> dict:
    r = subprocess.run([sys.executable, str(STREAM), mode, str(d)], input=data, capture_output=True)
    return json.loads(r.stdout)


def test_a_model_crosses_from_sender_to_receiver_and_replaces_what_was_there(tmp_path):
    src = _model(tmp_path / "a")
    dst = tmp_path / "b" / "model"
    dst.mkdir(parents=True)
    (dst / "stale.bin").write_bytes(b"old")
    (dst / "config.json").write_text("old config")
    port = _free_port()
    seed = subprocess.Popen([sys.executable, str(CHECKS / "image_seed.py"), "127.0.0.1", str(port), "127.0.0.1", "10"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    argv = IC.receive_argv("127.0.0.1", port, 10, sink=(sys.executable, str(STREAM), "receive", str(dst)))
    recv = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    data = _tar(src)
    threading.Thread(target=lambda: (seed.stdin.write(data), seed.stdin.close()), daemon=True).start()
    out, err = recv.communicate(timeout=60)
    sent = json.loads(seed.stdout.read())
    seed.wait(timeout=30)
    got = json.loads(out)
    assert recv.returncode == 0, err
    assert got["ok"] and got["sha256"] == sent["sha256"] == hashlib.sha256(data).hexdigest()
    assert got["bytes"] == sent["bytes"] == len(data)
    assert (dst / "stale.bin").exists()  # nothing replaced before the digests are compared
    done = _stream("commit", dst)
    assert done["ok"] and done["files"] == 3
    assert _sums(dst) == _sums(src)
    assert not (dst / MS.INCOMING).exists() and not (dst / "stale.bin").exists()


def test_a_changed_stream_gives_another_digest_and_a_cut_one_is_not_unpacked(tmp_path):
    src = _model(tmp_path / "a")
    dst = tmp_path / "b"
    dst.mkdir()
    (dst / "keep").write_text("the old model")
    data = bytearray(_tar(src))
    good = hashlib.sha256(data).hexdigest()
    i = data.index(b'{"model_type"')  # a byte of a file's content: tar's header checksums do not see it
    data[i + 3] ^= 0x01
    got = _stream("receive", dst, bytes(data))
    assert got["ok"] and got["sha256"] != good  # tar takes it; the digest is what refuses it
    cut = _stream("receive", dst, _tar(src)[:700_000])
    assert not cut["ok"] and "tar exit" in cut["error"]
    assert _stream("discard", dst)["ok"]
    assert sorted(os.listdir(dst)) == ["keep"]


def test_commit_without_a_received_copy_changes_nothing(tmp_path):
    (tmp_path / "keep").write_text("x")
    out = _stream("commit", tmp_path)
    assert not out["ok"] and "nothing received" in out["error"]
    assert os.listdir(tmp_path) == ["keep"]


def test_the_manifest_leaves_out_a_copy_being_received(tmp_path):
    d = _model(tmp_path)
    (d / MS.INCOMING).mkdir()
    (d / MS.INCOMING / "config.json").write_text("{}")
    out = subprocess.run(P.manifest_cmd(str(d)), capture_output=True, text=True, check=True).stdout
    assert sorted(P.model_manifest(out)) == ["config.json", "model.safetensors", "sub/tokenizer.json"]


def test_the_sender_streams_the_model_out_of_the_cluster_container_into_a_least_privilege_seed():
    argv = IC.seed_argv("reg/vllm:1", "10.0.0.1", 8476, ["10.0.0.2"], "SCRIPT",
                        source=MS.tar_argv("bootstrap-vllm", "/models/my model"), name=MS.SEED_CONTAINER)
    sh = argv[2]
    assert sh.startswith(f"docker rm -f {MS.SEED_CONTAINER} ")
    assert ("docker exec bootstrap-vllm tar -C '/models/my model' --exclude=./.bootstrap-incoming -cf - . | "
            f"docker run -i --rm --name {MS.SEED_CONTAINER} --network host --cap-drop ALL") in sh
    assert argv[4:] == ("reg/vllm:1", "SCRIPT", "10.0.0.1", "8476", "10.0.0.2", "60")
    recv = IC.receive_argv("10.0.0.1", 8476, sink=MS.stream_argv("bootstrap-vllm", "receive", "/m", "S",
                                                                  interactive=True))
    assert recv[2].endswith("docker exec -i bootstrap-vllm python3 -c S receive /m <&3")


class _Ssh:
    def __init__(self):
        self.calls = []

    def run(self, argv, **kw):
        self.calls.append(argv)
        return SimpleNamespace(stdout=json.dumps({"ok": True, "files": 1}), stderr="", exit_code=0, ok=True)


@pytest.mark.parametrize("got, want, refused", [
    ({"ok": True, "sha256": "ab" * 32, "bytes": 10}, "ab" * 32, None),
    ({"ok": True, "sha256": "cd" * 32, "bytes": 10}, "ab" * 32, "arrived as cdcdcdcdcdcdcdcd (10 bytes), not abab"),
    ({"ok": True, "sha256": "ab" * 32, "bytes": 10}, None, "not what was sent"),
    ({"ok": False, "error": "tar exit 2: unexpected EOF"}, "ab" * 32, "could not be unpacked: tar exit 2"),
])
def test_only_a_copy_with_the_senders_digest_is_put_in_place(got, want, refused):
    ssh = _Ssh()
    host = Host("node2", SSHTarget("10.0.0.2"), "10.0.0.2", "worker")
    sess = SimpleNamespace(ssh={"node2": ssh}, inv=SimpleNamespace(cluster=SimpleNamespace(container_name="c")))
    if refused is None:
        MS._check_and_commit(sess, host, "/m", "S", got, want, "node1", "")
        assert [a[-2] for a in ssh.calls] == ["commit"]
    else:
        with pytest.raises(PreflightFailed, match=re.escape(refused)) as e:
            MS._check_and_commit(sess, host, "/m", "S", got, want, "node1", "")
        assert e.value.host == "node2"
        assert [a[-2] for a in ssh.calls] == ["discard"]


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_fixture_tar_is_a_real_archive_of_the_three_files(tmp_path):
    names = tarfile.open(fileobj=io.BytesIO(_tar(_model(tmp_path)))).getnames()
    assert {"./config.json", "./model.safetensors", "./sub/tokenizer.json"} <= set(names)


def _local(argv: tuple[str, ...]) -> list[str]:
    """A `docker exec CONTAINER CMD...` of modelsync's, run here: CMD."""
    assert argv[:2] == ("docker", "exec")
    return list(argv[3:])


def _manifest(d: Path) -> dict[str, int]:
    out = subprocess.run(P.manifest_cmd(str(d)), capture_output=True, text=True, check=True).stdout
    return P.model_manifest(out)


def test_which_files_a_copy_carries_and_which_a_receiver_removes():
    head = {"config.json": 10, "a.safetensors": 100, "b.safetensors": 100}
    whole = {}
    partial = {"config.json": 10, "a.safetensors": 100, "b.safetensors": 7, "old.bin": 1}
    same = dict(head)
    assert P.sync_files(head, [whole]) is None  # everything: the whole directory
    assert P.sync_files(head, [partial]) == ("b.safetensors",)
    assert P.sync_files(head, [partial, {**head, "config.json": 11}]) == ("b.safetensors", "config.json")
    assert P.sync_files(head, [partial, whole]) is None
    assert P.sync_files(head, [{**same, "old.bin": 1}]) == ()  # only an extra file: nothing to send
    assert P.stale_files(head, partial) == ("old.bin",) and P.stale_files(head, same) == ()


def test_a_copy_carries_only_the_files_that_differ_and_leaves_the_others_untouched(tmp_path):
    src = _model(tmp_path / "a")
    (src / "model-00002.safetensors").write_bytes(os.urandom(2_000_000))
    dst = tmp_path / "b" / "model"
    (dst / "sub").mkdir(parents=True)
    for name in ("model.safetensors", "sub/tokenizer.json"):  # already there, as on the head
        (dst / name).write_bytes((src / name).read_bytes())
    (dst / "model-00002.safetensors").write_bytes(b"cut short")  # another size
    (dst / "old" / "deep").mkdir(parents=True)
    (dst / "old" / "deep" / "stale.bin").write_bytes(b"old")  # the head has no such file
    kept = (dst / "model.safetensors").stat().st_ino
    head, mine = _manifest(src), _manifest(dst)
    files = P.sync_files(head, [mine])
    assert files == ("config.json", "model-00002.safetensors")
    data = subprocess.run(_local(MS.tar_argv("c", str(src), files)), capture_output=True, check=True).stdout
    assert 2_000_000 < len(data) < 2_100_000  # not the 3 MB model.safetensors
    got = _stream("receive", dst, data)
    assert got["ok"] and got["sha256"] == hashlib.sha256(data).hexdigest()
    r = subprocess.run([sys.executable, str(STREAM), "merge", str(dst), *P.stale_files(head, mine)],
                       capture_output=True, text=True)
    done = json.loads(r.stdout)
    assert done == {"ok": True, "files": 4, "replaced": 2, "removed": 1}, r.stderr
    assert _sums(dst) == _sums(src)
    assert (dst / "model.safetensors").stat().st_ino == kept  # not rewritten
    assert not (dst / "old").exists() and not (dst / MS.INCOMING).exists()


def test_a_copy_with_nothing_to_send_still_removes_the_stale_files(tmp_path):
    src = _model(tmp_path / "a")
    dst = tmp_path / "b"
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    (dst / "extra.bin").write_bytes(b"x")
    files = P.sync_files(_manifest(src), [_manifest(dst)])
    assert files == ()
    data = subprocess.run(_local(MS.tar_argv("c", str(src), files)), capture_output=True, check=True).stdout
    assert _stream("receive", dst, data)["ok"]
    r = subprocess.run([sys.executable, str(STREAM), "merge", str(dst), "extra.bin"], capture_output=True, text=True)
    assert json.loads(r.stdout)["removed"] == 1
    assert _sums(dst) == _sums(src)


@pytest.mark.parametrize("bad", ["../outside", "/etc/passwd", ".", f"{MS.INCOMING}/x", "sub/../../outside"])
def test_merge_refuses_a_stale_path_outside_the_model_and_changes_nothing(tmp_path, bad):
    d = tmp_path / "model"
    d.mkdir()
    (d / "keep").write_text("x")
    (tmp_path / "outside").write_text("not the model's")
    (d / MS.INCOMING).mkdir()
    (d / MS.INCOMING / "new").write_text("y")
    r = subprocess.run([sys.executable, str(STREAM), "merge", str(d), "keep", bad], capture_output=True, text=True)
    out = json.loads(r.stdout)
    assert r.returncode == 1 and not out["ok"] and "refused path" in out["error"]
    assert (d / "keep").exists() and (tmp_path / "outside").exists() and not (d / "new").exists()


def test_the_sender_names_each_differing_file_so_none_is_read_as_an_option():
    argv = MS.tar_argv("c", "/m", ["-rf", "a b.json"])
    assert argv[-5:] == ("--no-recursion", "-cf", "-", "./-rf", "./a b.json")
    assert MS.tar_argv("c", "/m", [])[-1] == "."


def test_a_checked_copy_with_manifests_is_merged_with_the_receivers_stale_files():
    ssh = _Ssh()
    host = Host("node2", SSHTarget("10.0.0.2"), "10.0.0.2", "worker")
    sess = SimpleNamespace(ssh={"node2": ssh}, inv=SimpleNamespace(cluster=SimpleNamespace(container_name="c")))
    MS._check_and_commit(sess, host, "/m", "S", {"ok": True, "sha256": "ab" * 32}, "ab" * 32, "node1", "",
                         ("old.bin", "x/y"))
    assert ssh.calls == [("docker", "exec", "c", "python3", "-c", "S", "merge", "/m", "old.bin", "x/y")]
