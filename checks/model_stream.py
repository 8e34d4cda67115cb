"""Receive a model directory as a tar stream, check it, then put it in place. Runs in the cluster
container on the receiving node (started by bootstrap over SSH; the stream comes from a peer over
the data network, or from bootstrap itself when the data network cannot carry it).

argv: receive DIR   stdin is `tar -C DIR -cf - .` from the sender. It is unpacked into
                    DIR/.bootstrap-incoming (emptied first) while its SHA-256 is taken.
                    Prints {"bytes", "sha256", "ok", "error"}; exit 0 when tar unpacked it all.
      commit DIR    DIR's contents become what was received: every other entry of DIR is removed
                    and the received entries moved in (DIR may be a mount point: nothing renames
                    DIR itself). Prints {"ok", "files"}.
      discard DIR   Remove DIR/.bootstrap-incoming. Prints {"ok"}.

Bootstrap compares the sha256 with the one the sender computed of the stream it sent, and commits
only when they are equal: a stream cut short or changed on the way never replaces the model.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys

INCOMING = ".bootstrap-incoming"
CHUNK = 1 << 20


def receive(directory):
    stage = os.path.join(directory, INCOMING)
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    digest, size = hashlib.sha256(), 0
    tar = subprocess.Popen(["tar", "-C", stage, "-xf", "-"], stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    src = sys.stdin.buffer
    error = None
    try:
        while True:
            chunk = src.read1(CHUNK) if hasattr(src, "read1") else src.read(CHUNK)
            if not chunk:
                break
            digest.update(chunk)
            size += len(chunk)
            tar.stdin.write(chunk)
        tar.stdin.close()
    except OSError as exc:  # tar stopped reading: its own message says why
        error = f"{type(exc).__name__}: {exc}"
    err = tar.stderr.read().decode(errors="replace").strip()
    code = tar.wait()
    if code != 0:
        error = f"tar exit {code}: {err.splitlines()[-1] if err else error or ''}"[:300]
    return {"bytes": size, "sha256": digest.hexdigest(), "ok": code == 0 and error is None, "error": error}


def commit(directory):
    stage = os.path.join(directory, INCOMING)
    if not os.path.isdir(stage):
        return {"ok": False, "error": f"nothing received under {stage}"}
    for name in os.listdir(directory):
        if name == INCOMING:
            continue
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    files = 0
    for name in os.listdir(stage):
        os.rename(os.path.join(stage, name), os.path.join(directory, name))
    os.rmdir(stage)
    for _, _, names in os.walk(directory):
        files += len(names)
    return {"ok": True, "files": files}


def discard(directory):
    shutil.rmtree(os.path.join(directory, INCOMING), ignore_errors=True)
    return {"ok": True}


def main(argv):
    if len(argv) != 2 or argv[0] not in ("receive", "commit", "discard"):
        print(json.dumps({"ok": False, "error": "usage: receive|commit|discard DIR"}))
        return 2
    mode, directory = argv
    try:
        out = {"receive": receive, "commit": commit, "discard": discard}[mode](directory)
    except OSError as exc:
        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out), flush=True)
    return 0 if out.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
