#!/usr/bin/env bash
# Set up this (Debian 12) machine to run bootstrap and its sandbox: Debian packages, a running
# Docker engine, and the Python package. Idempotent; run as root. chromium (headless) takes the
# documentation site's screenshots in tests/docs/test_screenshots.py.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for pair in dockerd:docker.io debootstrap:debootstrap docker-registry:docker-registry \
            sshd:openssh-server ssh-keygen:openssh-client parallel-ssh:pssh ip:iproute2 tmux:tmux keepalived:keepalived \
            visudo:sudo \
            chromium:chromium; do
  cmd=${pair%%:*} pkg=${pair#*:}
  command -v "$cmd" >/dev/null 2>&1 || [[ -x /usr/sbin/$cmd ]] || need+=("$pkg")
done
if [[ ${#need[@]} -gt 0 ]]; then
  echo "dev-setup: installing ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# A Docker engine: nothing starts one on these machines, so start it when it does not answer.
if ! docker info >/dev/null 2>&1; then
  echo "dev-setup: starting dockerd" >&2
  nohup dockerd >/var/log/bootstrap-dockerd.log 2>&1 &
  for _ in $(seq 1 120); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { echo "dev-setup: dockerd did not start; see /var/log/bootstrap-dockerd.log" >&2; exit 1; }
fi

# Transparent huge pages for all anonymous memory, where root may set it: on this VM kind the first
# touch of a 4 KiB page costs about 60 us (1 GiB took 16-20 s; with huge pages 3-4 s), and every
# vLLM, torch and Ray process the sandbox starts pays that. BOOTSTRAP_DEV_THP=keep leaves it alone.
thp=/sys/kernel/mm/transparent_hugepage/enabled
if [[ ${BOOTSTRAP_DEV_THP:-always} != keep && -w $thp ]] && ! grep -q '\[always\]' "$thp"; then
  if echo always >"$thp" 2>/dev/null; then echo "dev-setup: transparent huge pages: always" >&2
  else echo "dev-setup: could not set transparent huge pages (left as: $(cat "$thp"))" >&2; fi
fi

python3 -m pip install -q -e '.[test,docs]' 2>&1 | grep -v -i "running pip as the 'root' user" || true
command -v bootstrap >/dev/null || { echo "dev-setup: the bootstrap command is not on PATH" >&2; exit 1; }
