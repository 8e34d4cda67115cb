#!/usr/bin/env python3
"""Fan-out benchmark: `bootstrap exec -- true`, `bootstrap status` and parallel-ssh, side by side.

For each N in --nodes, on the first N hosts of one set of hosts, several repetitions each (the
median is reported), interleaved so that drift hits every tool alike:

    exec    `bootstrap exec -i INV --parallel P -- true`   (a new process each time: start included)
    status  `bootstrap status -i INV --parallel P`          (its exit code is reported: on sshd-only
                                                              hosts there is no Docker, so it is 1)
    pssh    `parallel-ssh -h HOSTS -p P -x '-i KEY -o UserKnownHostsFile=KH ...' true`

Hosts come from (one of):
    default        `bootstrap sandbox up --nodes max(N) --kind sshd` (torn down at the end unless --keep)
    --inventory F  an existing native inventory (its first N hosts); nothing is created or removed
    --loopback     sshd processes on 127.0.0.2, 127.0.0.3, ... of this machine (no Docker)

Targets: exec(Nmax)/exec(1) <= 3 and exec(Nmax)/pssh(Nmax) <= 1.0, each printed as met, missed or not
measured, with the reason (one N only, no N=1, parallel-ssh not installed: the run goes on without
its column); exit status 1 when one is missed or a run of exec or pssh fails (see perf/verdict.py).

Example: python -m perf.fanout --nodes 1,16,64 --reps 3 --png fanout.png
"""
from __future__ import annotations

import argparse
import os
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bootstrap.inventory import load_inventory
from bootstrap.remote.fanout import DEFAULT_PARALLEL
from bootstrap.sandbox.sshd import SSHD, free_port, keygen  # the loopback sshd the tests use too
from perf import verdict as V
from perf.plot import line_plot

ROOT = Path(__file__).resolve().parent.parent

PSSH = "/usr/bin/parallel-ssh"
TOOLS = ("exec", "status", "pssh")
TARGET_SCALING = 3.0  # exec(Nmax) / exec(1)
TARGET_VS_PSSH = 1.0  # exec(Nmax) / pssh(Nmax)
# One sshd binds at most 16 sockets (OpenSSH's MAX_LISTEN_SOCKS).
ADDRS_PER_SSHD = 16


def log(msg: str) -> None:
    print(f"fanout: {msg}", file=sys.stderr, flush=True)


def bootstrap_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "bootstrap", *args]


# -- hosts -----------------------------------------------------------------------------------------
@dataclass
class Loopback:
    """sshd processes answering on 127.0.0.2..N+1 (one port), one host key, one client key."""

    dir: Path
    inventory: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


def loopback_hosts(workdir: Path, n: int, *, env: dict[str, str] | None = None,
                   container_name: str | None = None) -> Loopback:
    """Start sshd on 127.0.0.2..n+1 (same port) and write a native inventory for those n hosts:
    names h1..hn, data-plane IPs 10.99.x.y (never contacted), keys and known_hosts verified.
    ``env`` is set in every session (sshd SetEnv), e.g. a PATH with a fake `docker` first."""
    workdir.mkdir(parents=True, exist_ok=True)
    host_key = keygen(workdir / "ssh_host_ed25519_key")
    client_key = keygen(workdir / "id_ed25519")
    auth = workdir / "authorized_keys"
    shutil.copy(str(client_key) + ".pub", auth)
    os.chmod(auth, 0o600)
    port = free_port()
    addrs = [f"127.0.0.{k}" for k in range(2, n + 2)]
    if n > 250:
        raise ValueError("at most 250 loopback hosts")
    pub = (Path(str(host_key) + ".pub").read_text().split())[:2]
    known = workdir / "known_hosts"
    known.write_text("".join(f"[{a}]:{port} {pub[0]} {pub[1]}\n" for a in addrs))
    Path("/run/sshd").mkdir(exist_ok=True)
    lb = Loopback(workdir, workdir / "inventory.yaml")
    set_env = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    try:
        for i in range(0, n, ADDRS_PER_SSHD):
            cfg = workdir / f"sshd_config.{i // ADDRS_PER_SSHD}"
            listen = "".join(f"ListenAddress {a}:{port}\n" for a in addrs[i:i + ADDRS_PER_SSHD])
            cfg.write_text(f"""{listen}HostKey {host_key}
AuthorizedKeysFile {auth}
PidFile {workdir}/sshd.{i // ADDRS_PER_SSHD}.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxStartups 1000
MaxSessions 100
{'SetEnv ' + set_env if set_env else ''}
""")
            lb.procs.append(subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 10
        for a in (addrs[0], addrs[-1]):
            while True:
                try:
                    with socket.create_connection((a, port), timeout=0.2):
                        break
                except OSError:
                    if time.monotonic() > deadline or any(p.poll() is not None for p in lb.procs):
                        raise RuntimeError(f"sshd did not listen on {a}:{port}") from None
                    time.sleep(0.05)
    except BaseException:
        lb.stop()
        raise
    cluster: dict = {"name": "loopback", "accelerator": "none",
                     "ssh": {"user": "root", "port": port, "key": str(client_key), "known_hosts": str(known),
                             "connect_timeout": 5, "connect_retries": 0}}
    if container_name:
        cluster["container_name"] = container_name
    doc = {"cluster": cluster,
           "hosts": [{"name": f"h{k}", "address": a, "ip": f"10.99.{k // 250}.{k % 250 + 1}"}
                     for k, a in enumerate(addrs, start=1)]}
    lb.inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
    return lb


def sandbox_up(n: int) -> Path:
    log(f"bootstrap sandbox up --nodes {n} --kind sshd")
    r = subprocess.run(bootstrap_cmd("sandbox", "up", "--nodes", str(n), "--kind", "sshd"), cwd=ROOT,
                       stdout=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SystemExit(f"fanout: sandbox up failed (exit {r.returncode})")
    for line in r.stdout.splitlines():
        if line.startswith("inventory: "):
            return Path(line[len("inventory: "):].strip())
    raise SystemExit(f"fanout: no inventory path in the sandbox output:\n{r.stdout}")


def sandbox_down() -> int:
    log("bootstrap sandbox down")
    return subprocess.run(bootstrap_cmd("sandbox", "down"), cwd=ROOT).returncode


def subset(inventory: Path, n: int, workdir: Path) -> tuple[Path, Path, list[str]]:
    """The first n hosts of a native inventory: (inventory file, pssh hosts file, pssh -x args)."""
    doc = yaml.safe_load(inventory.read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("hosts"), list):
        raise SystemExit(f"fanout: {inventory}: a native inventory (with a hosts list) is needed")
    if len(doc["hosts"]) < n:
        raise SystemExit(f"fanout: {inventory} has {len(doc['hosts'])} host(s), {n} wanted")
    doc = dict(doc, hosts=doc["hosts"][:n])
    doc["hosts"][0] = dict(doc["hosts"][0], role="head")
    for h in doc["hosts"][1:]:
        h.pop("role", None)
    inv_path = workdir / f"inventory-{n}.yaml"
    inv_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    inv = load_inventory(str(inv_path))
    keys = {h.ssh.key for h in inv.hosts}
    if len(keys) != 1 or None in keys:
        raise SystemExit("fanout: pssh needs one key for every host (cluster.ssh.key)")
    lines = []
    for h in inv.hosts:
        t = h.ssh
        lines.append(f"{t.user + '@' if t.user else ''}{t.address}{':' + str(t.port) if t.port else ''}")
    hosts_file = workdir / f"pssh-hosts-{n}"
    hosts_file.write_text("\n".join(lines) + "\n")
    extra = ["-i", str(Path(keys.pop()).expanduser()), "-o", "StrictHostKeyChecking=yes",
             "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes"]
    if inv.cluster.ssh.known_hosts:
        extra += ["-o", f"UserKnownHostsFile={Path(inv.cluster.ssh.known_hosts).expanduser()}"]
    return inv_path, hosts_file, extra


# -- measuring -------------------------------------------------------------------------------------
def commands(inv: Path, hosts_file: Path, ssh_extra: list[str], parallel: int,
             pssh: str | None) -> dict[str, list[str]]:
    """The commands timed, by tool; without pssh (None: not installed) no "pssh" entry."""
    cmds = {
        "exec": bootstrap_cmd("exec", "-i", str(inv), "--parallel", str(parallel), "--", "true"),
        "status": bootstrap_cmd("status", "-i", str(inv), "--parallel", str(parallel)),
    }
    if pssh:
        cmds["pssh"] = [pssh, "-h", str(hosts_file), "-p", str(parallel), "-t", "60", "-x", shlex.join(ssh_extra),
                        "true"]
    return cmds


def hosts_cpu() -> float | None:
    """CPU seconds used so far by the sandbox node containers (their sshd and what it runs), from
    the Docker cgroups; None where that cannot be read (loopback or --inventory hosts)."""
    r = subprocess.run(["docker", "ps", "-q", "--no-trunc", "--filter", "name=bootstrap-sandbox-node"],
                       capture_output=True, text=True)
    total, found = 0.0, False
    for cid in r.stdout.split() if r.returncode == 0 else []:
        for f, scale in ((f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage", 1e-9),
                         (f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat", 1e-6),
                         (f"/sys/fs/cgroup/docker/{cid}/cpu.stat", 1e-6)):
            try:
                text = Path(f).read_text()
            except OSError:
                continue
            found = True
            total += scale * int(text.split()[1] if text.startswith("usage_usec") else text)
            break
    return total if found else None


def timed(argv: list[str]) -> tuple[float, int, str, float, float | None]:
    """Wall seconds, exit code, output, our CPU seconds (the child's), the hosts' CPU seconds."""
    c0, h0 = resource.getrusage(resource.RUSAGE_CHILDREN), hosts_cpu()
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t0
    c1, h1 = resource.getrusage(resource.RUSAGE_CHILDREN), hosts_cpu()
    ours = (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)
    return wall, r.returncode, r.stdout, ours, (h1 - h0 if h0 is not None and h1 is not None else None)


@dataclass
class Row:
    n: int
    seconds: dict[str, list[float]] = field(default_factory=dict)
    codes: dict[str, set[int]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)
    hosts_cpu: dict[str, list[float]] = field(default_factory=dict)

    def has(self, tool: str) -> bool:
        """Whether this row timed the tool (pssh is left out when it is not installed)."""
        return bool(self.seconds.get(tool))

    def median(self, tool: str) -> float:
        return statistics.median(self.seconds[tool])

    def cpu_floor(self, tool: str) -> float | None:
        """The least wall time the CPU work of one run allows on this machine: (our CPU + the
        hosts' CPU) / cores. All hosts share these cores in the sandbox; real hosts do not."""
        if not self.hosts_cpu.get(tool):
            return None
        return (statistics.median(self.cpu[tool]) + statistics.median(self.hosts_cpu[tool])) / (os.cpu_count() or 1)


def measure(n: int, cmds: dict[str, list[str]], reps: int) -> Row:
    row = Row(n, {t: [] for t in cmds}, {t: set() for t in cmds}, {t: [] for t in cmds}, {t: [] for t in cmds})
    for t, argv in cmds.items():  # warm-up: caches, first connections; not counted
        _, code, output, _, _ = timed(argv)
        if code != 0 and t != "status":
            log(f"N={n} {t} exited {code}:\n{output[-2000:]}")
    for _ in range(reps):
        for t, argv in cmds.items():
            s, code, _, ours, theirs = timed(argv)
            row.seconds[t].append(s)
            row.codes[t].add(code)
            row.cpu[t].append(ours)
            if theirs is not None:
                row.hosts_cpu[t].append(theirs)
    log(f"N={n}: " + ", ".join(f"{t} {row.median(t):.3f}s" for t in cmds))
    return row


# -- report ----------------------------------------------------------------------------------------
def table(rows: list[Row]) -> str:
    base = rows[0].median("exec")
    head = ("N", "exec (s)", "status (s)", "pssh (s)", f"exec(N)/exec({rows[0].n})", "exec/pssh",
            "exec CPU ours+hosts (s)", "exec CPU floor (s)", "pssh CPU ours+hosts (s)")
    body = []
    for r in rows:
        st = f"{r.median('status'):.3f}"
        if r.codes["status"] != {0}:
            st += f" (exit {','.join(map(str, sorted(r.codes['status'])))})"
        ex = f"{r.median('exec'):.3f}" + ("" if r.codes["exec"] == {0} else " (FAILED)")
        ps = "-" if not r.has("pssh") else f"{r.median('pssh'):.3f}" + ("" if r.codes["pssh"] == {0} else " (FAILED)")
        def cpu(t: str, r: Row = r) -> str:
            if not r.cpu.get(t):
                return "-"
            if not r.hosts_cpu.get(t):
                return f"{statistics.median(r.cpu[t]):.2f}+?"
            return f"{statistics.median(r.cpu[t]):.2f}+{statistics.median(r.hosts_cpu[t]):.2f}"
        floor = r.cpu_floor("exec")
        body.append((str(r.n), ex, st, ps, f"{r.median('exec') / base:.2f}",
                     f"{r.median('exec') / r.median('pssh'):.2f}" if r.has("pssh") else "-", cpu("exec"),
                     "-" if floor is None else f"{floor:.2f}", cpu("pssh")))
    widths = [max(len(x[i]) for x in (head, *body)) for i in range(len(head))]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths)), *(fmt.format(*b) for b in body)])


def write_png(rows: list[Row], path: str, title: str) -> None:
    """Median wall time vs N, one line per tool."""
    line_plot(path, title, [r.n for r in rows],
              {label: [r.median(t) if r.has(t) else None for r in rows]
               for t, label in (("exec", "bootstrap exec -- true"), ("status", "bootstrap status"),
                                ("pssh", "parallel-ssh true")) if any(r.has(t) for r in rows)},
              xlabel="hosts (N)", prefix="fanout")


def checks(rows: list[Row]) -> tuple[list[V.Check], list[str]]:
    """Both targets checked against what the run measured (not measured, with the reason, where it
    could not be: one N, no N=1, no pssh, a tool whose runs failed), and the runs that failed."""
    failures = [f"N={r.n}: a run of {t} failed (exit {','.join(map(str, sorted(r.codes[t])))})"
                for r in rows for t in ("exec", "pssh") if r.has(t) and r.codes[t] != {0}]
    first, last = rows[0], rows[-1]
    ok = {(r.n, t): r.has(t) and r.codes[t] == {0} for r in rows for t in ("exec", "pssh")}
    out = []
    scaling = ("exec(Nmax)/exec(1)", "<=", TARGET_SCALING)
    if (why := V.no_ratio_to_one([r.n for r in rows])) is not None:
        out.append(V.not_measured(*scaling, why))
    elif not (ok[(1, "exec")] and ok[(last.n, "exec")]):
        out.append(V.not_measured(*scaling, f"exec failed at N={(last if ok[(1, 'exec')] else first).n}"))
    else:
        out.append(V.Check(f"exec({last.n})/exec(1)", "<=", TARGET_SCALING,
                           last.median("exec") / first.median("exec")))
    vs = (f"exec({last.n})/pssh({last.n})", "<=", TARGET_VS_PSSH)
    if not last.has("pssh"):
        out.append(V.not_measured(*vs, "parallel-ssh not run: not installed (apt-get install pssh) or --pssh ''"))
    elif not ok[(last.n, "pssh")]:
        out.append(V.not_measured(*vs, f"pssh failed at N={last.n}"))
    elif not ok[(last.n, "exec")]:
        out.append(V.not_measured(*vs, f"exec failed at N={last.n}"))
    else:
        out.append(V.Check(*vs, last.median("exec") / last.median("pssh")))
    return out, failures


def verdict(rows: list[Row]) -> list[str]:
    """The runs that failed and the targets missed, one phrase each (empty: none failed or missed;
    `checks` says which targets were measured at all)."""
    found, failures = checks(rows)
    return failures + [c.shortfall for c in found if c.passed is False]


def _interrupt(signum, frame):  # noqa: ANN001 - signal handler
    raise KeyboardInterrupt


def no_docker_path(workdir: Path) -> str:
    """A PATH whose `docker` answers like a host without Docker (as sandbox sshd-only nodes)."""
    fake = workdir / "nodocker"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "docker").write_text("#!/bin/sh\necho 'sh: 1: docker: not found' >&2\nexit 127\n")
    (fake / "docker").chmod(0o755)
    return f"{fake}:/usr/local/bin:/usr/bin:/bin"


def quiet_env(workdir: Path) -> dict[str, str]:
    """Session environment of loopback hosts: no Docker (as on sshd-only sandbox nodes), and
    SHLVL=1 so that Debian's bash, started by sshd, skips this machine's ~/.bashrc (pyenv and the
    like cost 0.2 s per command here; a minimal node has none of it)."""
    return {"PATH": no_docker_path(workdir), "SHLVL": "1"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="1,16,64", help="host counts, comma-separated (default 1,16,64)")
    p.add_argument("--reps", type=int, default=3, help="timed runs per tool and N (median; default 3)")
    p.add_argument("--parallel", type=int, default=DEFAULT_PARALLEL,
                   help=f"--parallel of bootstrap and -p of pssh (default {DEFAULT_PARALLEL})")
    p.add_argument("--png", default="fanout.png", help="time vs N plot (default fanout.png)")
    p.add_argument("--keep", action="store_true", help="leave the sandbox up at the end")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--inventory", type=Path, help="use this native inventory's first N hosts (no sandbox)")
    src.add_argument("--loopback", action="store_true", help="sshd on 127.0.0.2.. of this machine (no sandbox)")
    p.add_argument("--pssh", default=PSSH, help=f"parallel-ssh binary (default {PSSH}; '' or not installed: "
                   "no pssh column, and exec/pssh is not measured)")
    a = p.parse_args(argv)
    nodes = sorted({int(x) for x in a.nodes.split(",") if x.strip()})
    if not nodes or nodes[0] < 1 or a.reps < 1:
        p.error("--nodes needs positive counts and --reps at least 1")
    pssh = a.pssh if a.pssh and os.access(a.pssh, os.X_OK) else None
    if a.pssh and pssh is None:
        log(f"{a.pssh} not found (apt-get install pssh): no pssh column, exec/pssh not measured")

    work = Path(tempfile.mkdtemp(prefix="bootstrap-fanout-"))
    loop: Loopback | None = None
    made_sandbox = False
    # A Ctrl-C or kill still tears down what this run started.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        if a.inventory:
            inventory, source = a.inventory, str(a.inventory)
        elif a.loopback:
            # Loopback hosts are this machine: keep `bootstrap status` off its Docker engine.
            loop = loopback_hosts(work / "loopback", nodes[-1], env=quiet_env(work))
            inventory, source = loop.inventory, "loopback sshd"
        else:
            made_sandbox = True
            inventory, source = sandbox_up(nodes[-1]), "sandbox (sshd nodes)"
        rows = []
        for n in nodes:
            inv, hosts_file, extra = subset(inventory, n, work)
            rows.append(measure(n, commands(inv, hosts_file, extra, a.parallel, pssh), a.reps))
        print(f"fan-out on {source}: median of {a.reps} run(s), --parallel {a.parallel}, {os.cpu_count()} CPU(s)")
        print(table(rows))
        print("CPU floor = (our CPU + the hosts' CPU) / cores: the least wall time this machine allows when the "
              "hosts' sshd share its cores (sandbox); on real hosts their part runs on each host")
        if a.png:
            write_png(rows, a.png, f"fan-out, {source}, -p {a.parallel}")
            print(f"plot: {a.png}")
        found, failures = checks(rows)
        for line in V.lines(found, failures):
            print(line)
        return V.exit_status(found, failures)
    finally:
        if loop is not None:
            loop.stop()
        if made_sandbox and not a.keep:
            sandbox_down()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
