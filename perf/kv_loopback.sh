#!/usr/bin/env bash
# The KV transfer check (checks/kv_check.py) with both sides on one host, over loopback: what
# `serve` runs between a prefill head and a decode head, here on one machine (a lent GPU host, or a
# container of the sandbox image). Prints each side's stdout (its JSON lines) and then its stderr
# (UCX's and NIXL's own lines), each line prefixed with the label, the side and the stream.
#   perf/kv_loopback.sh LABEL [kv_check options: --device cuda --mib 1024 --blocks 256 --rounds 5 ...]
# Exit status: the reader's, or the source's if the reader passed.
set -u
label=$1; shift
here=$(cd "$(dirname "$0")/.." && pwd)
port=${KV_PORT:-29555}
py=${PYTHON:-python3}
tmp=$(mktemp -d)
"$py" "$here/checks/kv_check.py" source --ip 127.0.0.1 --port "$port" "$@" >"$tmp/source" 2>"$tmp/source.err" &
src=$!
"$py" "$here/checks/kv_check.py" reader --ip 127.0.0.1 --peer 127.0.0.1 --port "$port" "$@" >"$tmp/reader" 2>"$tmp/reader.err"
rrc=$?
wait "$src"
src_rc=$?
for side in source reader; do
  sed "s/^/$label $side: /" "$tmp/$side"
  sed "s/^/$label $side stderr: /" "$tmp/$side.err"
done
echo "$label: reader exit $rrc, source exit $src_rc"
rm -rf "$tmp"
[ "$rrc" -ne 0 ] && exit "$rrc"
exit "$src_rc"
