"""A real OpenSSH server on loopback for transport tests (key auth, its own host key)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


@dataclass
class Sshd:
    port: int
    host_key: Path
    client_key: Path
    proc: subprocess.Popen
    dir: Path

    def known_hosts_line(self) -> str:
        pub = Path(str(self.host_key) + ".pub").read_text().split()
        return f"[127.0.0.1]:{self.port} {pub[0]} {pub[1]}\n"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_sshd(tmp: Path) -> Sshd:
    tmp.mkdir(parents=True, exist_ok=True)
    host_key = keygen(tmp / "ssh_host_ed25519_key")
    client_key = keygen(tmp / "id_ed25519")
    auth = tmp / "authorized_keys"
    shutil.copy(str(client_key) + ".pub", auth)
    os.chmod(auth, 0o600)
    port = free_port()
    cfg = tmp / "sshd_config"
    cfg.write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {host_key}
AuthorizedKeysFile {auth}
PidFile {tmp}/sshd.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
""")
    Path("/run/sshd").mkdir(exist_ok=True)
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return Sshd(port, host_key, client_key, proc, tmp)
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {proc.stderr.read().decode()}") from None
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("sshd did not listen within 10s")
