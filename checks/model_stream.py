"""Receive a model directory as a tar stream, check it, then put it in place. Runs in the cluster
container on the receiving node (started by bootstrap over SSH; the stream comes from a peer over
the data network, or from bootstrap itself when the data network cannot carry it).

argv: receive DIR   stdin is `tar -C DIR -cf - .` from the sender. It is unpacked into
                    DIR/.bootstrap-incoming (emptied first) while its SHA-256 is taken.
                    Prints {"bytes", "sha256", "ok", "error"}; exit 0 when tar unpacked it all.
      commit DIR    DIR's contents become what was received: every other entry of DIR is removed
                    and the received entries moved in (DIR may be a mount point: nothing renames
                    DIR itself). Prints {"ok", "files"}.
      merge DIR [STALE...]
                    What was received (only the files that differ) replaces those files under DIR,
                    and the STALE files (relative paths the sender does not have) are removed;
                    every other file stays. Prints {"ok", "files", "replaced", "removed"}.
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


def _inside(directory, rel):
    """DIR/REL, refused unless REL is a plain relative path that stays under DIR."""
    norm = os.path.normpath(rel)
    if os.path.isabs(rel) or norm in (".", "") or norm.split(os.sep)[0] in ("..", INCOMING):
        raise OSError(f"refused path {rel!r}: not a file under the model directory")
    return os.path.join(directory, norm)


def _prune(directory, path):
    """Remove the empty directories between PATH's parent and DIR."""
    parent = os.path.dirname(path)
    while os.path.abspath(parent) != os.path.abspath(directory):
        try:
            os.rmdir(parent)
        except OSError:
            return
        parent = os.path.dirname(parent)


def merge(directory, stale):
    stage = os.path.join(directory, INCOMING)
    if not os.path.isdir(stage):
        return {"ok": False, "error": f"nothing received under {stage}"}
    targets = [_inside(directory, rel) for rel in stale]  # every path checked before anything changes
    removed = replaced = 0
    for path in targets:
        if os.path.islink(path) or os.path.isfile(path):
            os.remove(path)
            removed += 1
            _prune(directory, path)
    for root, dirs, names in os.walk(stage):
        links = [d for d in dirs if os.path.islink(os.path.join(root, d))]
        for name in [*names, *links]:
            src = os.path.join(root, name)
            dst = os.path.join(directory, os.path.relpath(src, stage))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if os.path.isdir(dst) and not os.path.islink(dst):
                shutil.rmtree(dst)
            os.replace(src, dst)
            replaced += 1
    shutil.rmtree(stage)
    files = sum(len(names) for _, _, names in os.walk(directory))
    return {"ok": True, "files": files, "replaced": replaced, "removed": removed}


def discard(directory):
    shutil.rmtree(os.path.join(directory, INCOMING), ignore_errors=True)
    return {"ok": True}


def main(argv):
    modes = ("receive", "commit", "merge", "discard")
    if len(argv) < 2 or argv[0] not in modes or (len(argv) > 2 and argv[0] != "merge"):
        print(json.dumps({"ok": False, "error": "usage: receive|commit|discard DIR, or merge DIR [STALE...]"}))
        return 2
    mode, directory = argv[:2]
    try:
        out = merge(directory, argv[2:]) if mode == "merge" else {
            "receive": receive, "commit": commit, "discard": discard}[mode](directory)
    except OSError as exc:
        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out), flush=True)
    return 0 if out.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
