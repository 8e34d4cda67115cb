"""serve --sync-model's copy: the head (checks/image_seed.py reading tar) and a chain of receivers
(the same script, reading the node before it, unpacking with tar and passing the stream on) over
real loopback sockets with real tar, what a broken link or a failed tar gives, and the refusal of a
stream whose digest is not the head's."""
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from bootstrap.cluster.imagedist import plan as IC
from bootstrap.errors import PreflightFailed
from bootstrap.model import Host, SSHTarget
from bootstrap.serve import manifest as P
from bootstrap.serve import modelsync as MS

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


SEED = CHECKS / "image_seed.py"


def _node(args: tuple[str, ...]) -> subprocess.Popen:
    """checks/image_seed.py with the arguments sync_model gives it in a node's cluster container, run here."""
    return subprocess.Popen([sys.executable, str(SEED), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _done(p: subprocess.Popen) -> tuple[int, dict]:
    out, err = p.communicate(timeout=60)
    return p.returncode, json.loads(out.decode().strip().splitlines()[-1])


def test_a_model_passes_down_a_chain_and_each_node_commits_the_heads_files(tmp_path):
    """The head (127.0.0.1) serves the first receiver only; each receiver unpacks the stream and
    passes it on to the next (127.0.0.2 -> 127.0.0.3 -> 127.0.0.4), each from its own address."""
    src = _model(tmp_path / "a")
    dsts = []
    for i in range(3):
        d = tmp_path / f"n{i}" / "model"
        d.mkdir(parents=True)
        (d / "stale.bin").write_bytes(b"old")
        dsts.append(d)
    port, ips = _free_port(), ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]
    kids = IC.tree_children(3, IC.MODEL_FANOUT)
    assert kids == {0: [1], 1: [2], 2: [3]}  # serve's default: a chain
    nodes = [_node(MS.send_args(ips[0], port, [ips[1]], str(src), None, wait_s=20))]
    for i, d in enumerate(dsts, start=1):
        nodes.append(_node(MS.pass_args(ips[i], port, [ips[c] for c in kids.get(i, [])], ips[i - 1], str(d),
                                        wait_s=20)))
    (rc0, sent), *rest = [_done(p) for p in nodes]
    data = _tar(src)
    assert rc0 == 0 and sent["served"] == ["127.0.0.2"] and sent["error"] is None
    assert sent["sha256"] == hashlib.sha256(data).hexdigest() and sent["bytes"] == len(data)
    for (rc, got), d, nxt in zip(rest, dsts, ["127.0.0.3", "127.0.0.4", None]):
        assert rc == 0 and got["sink"]["ok"] and got["error"] is None, got
        assert got["sha256"] == sent["sha256"] and got["bytes"] == sent["bytes"]
        assert got["served"] == ([nxt] if nxt else [])
        assert (d / "stale.bin").exists()  # nothing replaced before the digests are compared
        assert _sums(d / MS.INCOMING) == _sums(src)
        assert _stream("commit", d)["ok"] and _sums(d) == _sums(src) and not (d / MS.INCOMING).exists()


def test_a_node_whose_upstream_breaks_reports_a_short_digest_and_its_own_next_gets_the_same(tmp_path):
    """The node before it sends half the head's stream and goes away: the receiver and the one it
    passes on to both read a stream whose digest is not the head's (refused by _check_and_commit)."""
    import socket

    data = _tar(_model(tmp_path / "a"))
    port = _free_port()
    srv = socket.create_server(("127.0.0.1", port))
    d1, d2 = tmp_path / "n1", tmp_path / "n2"
    d1.mkdir()
    d2.mkdir()
    mid = _node(MS.pass_args("127.0.0.2", port, ["127.0.0.3"], "127.0.0.1", str(d1), wait_s=20))
    last = _node(MS.pass_args("127.0.0.3", port, [], "127.0.0.2", str(d2), wait_s=20))
    c, _ = srv.accept()
    c.sendall(data[: len(data) // 2])
    c.close()
    srv.close()
    for p in (mid, last):
        rc, got = _done(p)
        assert rc == 1 and got["sha256"] != hashlib.sha256(data).hexdigest() and got["bytes"] == len(data) // 2
        assert not got["sink"]["ok"] and "the sink exited" in got["sink"]["error"]  # tar: unexpected end


def test_a_receiver_whose_upstream_never_answers_exits_no_sender(tmp_path):
    p = _node(MS.pass_args("127.0.0.2", _free_port(), [], "127.0.0.1", str(tmp_path), wait_s=1))
    rc, got = _done(p)
    assert rc == IC.NO_SENDER and "nothing answers on 127.0.0.1" in got["error"]


def test_a_head_whose_tar_fails_says_so_and_exits_1(tmp_path):
    port = _free_port()
    head = _node(MS.send_args("127.0.0.1", port, ["127.0.0.2"], str(tmp_path / "absent"), None, wait_s=20))
    recv = _node(MS.pass_args("127.0.0.2", port, [], "127.0.0.1", str(tmp_path / "n"), wait_s=20))
    rc, sent = _done(head)
    _done(recv)
    assert rc == 1 and sent["error"] == "the source exited 2"


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


def test_every_end_of_the_copy_runs_in_its_cluster_container_bound_to_its_data_plane_ip():
    """No `docker run -i` or `docker exec -i`: no byte of the model through Docker's stdio."""
    send = MS.send_args("10.0.0.1", 8476, ["10.0.0.2"], "/models/my model", None)
    assert send[:4] == ("10.0.0.1", "8476", "10.0.0.2", "60") and send[4] == "--source-json"
    assert json.loads(send[5]) == ["tar", "-C", "/models/my model", "--exclude=./.bootstrap-incoming", "-cf", "-", "."]
    recv = MS.pass_args("10.0.0.2", 8476, ["10.0.0.3"], "10.0.0.1", "/models/my model/")
    assert recv[:6] == ("10.0.0.2", "8476", "10.0.0.3", "60", "--from", "10.0.0.1") and recv[6] == "--sink-json"
    assert json.loads(recv[7])[-1] == "/models/my model/.bootstrap-incoming"
    assert "0.0.0.0" not in send + recv


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
