#!/bin/sh
# Entry point of a sandbox node (baked into bootstrap-sandbox/node as /usr/local/sbin/sandbox-node-init).
# Installs the files mounted read-only at /sandbox, starts the node's own dockerd (unless
# SANDBOX_NO_DOCKERD=1), waits for it, then becomes sshd.
set -eu

SRC=/sandbox

install -d -m 700 /root/.ssh
if [ -f "$SRC/authorized_keys" ]; then
    install -m 600 "$SRC/authorized_keys" /root/.ssh/authorized_keys
fi

if [ -f "$SRC/ssh_host_ed25519_key" ]; then
    install -m 600 "$SRC/ssh_host_ed25519_key" /etc/ssh/ssh_host_ed25519_key
    if [ -f "$SRC/ssh_host_ed25519_key.pub" ]; then
        install -m 644 "$SRC/ssh_host_ed25519_key.pub" /etc/ssh/ssh_host_ed25519_key.pub
    fi
elif [ ! -f /etc/ssh/ssh_host_ed25519_key ]; then
    ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key
fi

install -d -m 755 /run/sshd

# The logins that are not root (bootstrap/sandbox/recipes.py SUDO_USER, LEAST_USER): the same key, and
# the sandbox's password, which their sudo asks for.
for u in ops deploy; do
    id "$u" >/dev/null 2>&1 || continue
    install -d -m 700 -o "$u" -g "$u" "/home/$u/.ssh"
    if [ -f "$SRC/authorized_keys" ]; then
        install -m 600 -o "$u" -g "$u" "$SRC/authorized_keys" "/home/$u/.ssh/authorized_keys"
    fi
    if [ -f "$SRC/sudo-password" ]; then
        printf '%s:%s\n' "$u" "$(cat "$SRC/sudo-password")" | chpasswd
    fi
done

# A GPU-shaped node (bootstrap/sandbox/gpu.py): nvidia-smi and the NVIDIA Container Toolkit's hook
# on PATH before dockerd starts (dockerd looks the hook up when it starts), and a character device
# per HCA under /dev/infiniband.
GPU="$SRC/gpu"
# A node whose GPUs come through CDI (cdi.yaml, bootstrap/sandbox/gpu.py): the spec in /etc/cdi, a device
# node per GPU, and the hook off PATH, where only the spec runs it.
if [ -d "$GPU" ]; then
    install -m 755 "$GPU/nvidia-smi" /usr/local/bin/nvidia-smi
    if [ -f "$GPU/cdi.yaml" ]; then
        install -d -m 755 /etc/cdi /usr/local/lib/sandbox-gpu
        install -m 755 "$GPU/nvidia-container-runtime-hook" /usr/local/lib/sandbox-gpu/nvidia-container-runtime-hook
        install -m 644 "$GPU/cdi.yaml" /etc/cdi/nvidia.yaml
        for dev in $(sed -n 's|^.*path: /dev/\(nvidia[a-z0-9]*\)$|\1|p' "$GPU/cdi.yaml" | sort -u); do
            [ -e "/dev/$dev" ] || mknod -m 666 "/dev/$dev" c 1 3
        done
    else
        install -m 755 "$GPU/nvidia-container-runtime-hook" /usr/local/bin/nvidia-container-runtime-hook
    fi
    if [ -f "$GPU/uverbs" ]; then
        install -d -m 755 /dev/infiniband
        i=0
        while [ "$i" -lt "$(cat "$GPU/uverbs")" ]; do
            [ -e "/dev/infiniband/uverbs$i" ] || mknod -m 666 "/dev/infiniband/uverbs$i" c 1 3
            i=$((i + 1))
        done
    fi
fi

if [ "${SANDBOX_NO_DOCKERD:-0}" != "1" ]; then
    if [ -f "$SRC/daemon.json" ]; then
        install -d -m 755 /etc/docker
        install -m 644 "$SRC/daemon.json" /etc/docker/daemon.json
    fi
    # A stale pid file from a previous run of this container would stop dockerd from starting.
    rm -f /var/run/docker.pid /var/run/docker/containerd/containerd.pid
    # /proc/sys is read-only in a node container: Docker 26 would refuse every bridged container for not
    # being able to turn IPv6 off on its interface (a real host lets it); this is Docker's own escape hatch.
    DOCKER_ALLOW_IPV6_ON_IPV4_INTERFACE=1 dockerd >/var/log/dockerd.log 2>&1 &
    tries=0
    until docker version >/dev/null 2>&1; do
        tries=$((tries + 1))
        if [ "$tries" -ge 120 ]; then
            echo "sandbox-node-init: dockerd did not come up within 60 s; last lines of /var/log/dockerd.log:" >&2
            tail -n 20 /var/log/dockerd.log >&2 || true
            exit 1
        fi
        sleep 0.5
    done
    echo "sandbox-node-init: dockerd ready" >&2
fi

if [ -d "$GPU/class" ]; then
    # sysfs is read-only and /sys/class/infiniband cannot be made in it: sshd (and so every command
    # bootstrap runs over SSH) gets its own mount namespace with the node's fake class tree over
    # /sys/class; dockerd keeps the real one.
    echo "sandbox-node-init: starting sshd with $GPU/class over /sys/class" >&2
    exec unshare --mount --propagation private sh -c "mount --bind '$GPU/class' /sys/class && exec /usr/sbin/sshd -D -e"
fi
echo "sandbox-node-init: starting sshd" >&2
exec /usr/sbin/sshd -D -e
