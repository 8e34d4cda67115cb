"""`bootstrap serve` with real vLLM (CPU build) on the sandbox.

On CPU the end-to-end path is vLLM's native multi-node mode; the Ray executor refuses CPU
platforms, so serve picks native by itself and refuses --backend ray before launching anything.
"""
import json
import os
import re
import subprocess
import time
import urllib.request

import pytest

from bootstrap.cli.become import BECOME_ENV
from tests.support.sandbox import (
    CONTAINER,
    cli,
    container_id,
    firewalld_off,
    firewalld_on,
    listeners,
    nft_ruleset,
    on_node,
    stranger_scan,
    write_inventory,
)

pytestmark = pytest.mark.sandbox
MODEL = "/opt/models/tiny-llama"
VLLM_ARGS = ["--", "--enforce-eager", "--max-model-len", "256"]
# Pipeline stages on CPU need vLLM's warm-up pass, which --enforce-eager skips (serve refuses it):
# the 3-node serves run as a user would run them, with no vLLM flags.
PP_ARGS = []
PROMPT = "The quick brown fox"


def complete(endpoint, model):
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 16, "temperature": 0}).encode()
    req = urllib.request.Request(endpoint + "/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())["choices"][0]["text"]


def vllm_procs(node):
    return vllm_procs_in(node, CONTAINER)


def vllm_procs_in(node, container):
    ps = on_node(node, "docker", "exec", container, "sh", "-c",
                 "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done", check=False).stdout
    return [ln for ln in ps.splitlines() if "vllm serve" in ln or ln.startswith("VLLM::")]


def nft_tables(node):
    return on_node(node, "nft", "list", "tables").stdout


@pytest.fixture(scope="module")
def three(sandbox3, tmp_path_factory):
    """The 3-node Ray cluster as the README's main job leaves it, on a mixed rack (issue 63): node1 is reached
    as root; node2 as a user that is not root (the sandbox's SUDO_USER, in the docker group) whose sudo asks
    for its password and allows it all, as stock Ubuntu and DGX OS set it; node3 (Debian 13, Docker 26.1
    with the containerd image store: the shared sandbox's odd node) as a user in the docker group only
    (LEAST_USER), whose sudo allows exactly what `bootstrap sudoers` prints for this cluster (installed
    here as an admin would), with its password. The password is given as a script gives it
    ($BOOTSTRAP_BECOME_PASSWORD), for every test of this module; node3 runs firewalld with its default
    zone. Before that, `up` is refused at its preflight in one line per host with a fix that works, and
    changes nothing: firewalld's reject of the other nodes (the fix, run as printed, lets them in), then
    no password, then a wrong one."""
    from bootstrap.sandbox.recipes import LEAST_USER, SUDO_USER

    assert sandbox3.nodes[2].host == "debian13", sandbox3.nodes
    users = (SUDO_USER, LEAST_USER)
    inv = write_inventory(sandbox3.inventory, tmp_path_factory.mktemp("mixed") / "mixed.yaml",
                          lambda d: [h.update(user=u) for h, u in zip(d["hosts"][1:], users)])
    password = sandbox3.sudo_password_file.read_text().strip()
    cli("down", "--yes", "-i", str(sandbox3.inventory))
    os.environ.pop(BECOME_ENV, None)
    node3 = sandbox3.nodes[2]
    rule = cli("sudoers", "-i", inv, "--user", LEAST_USER)  # the least-privilege rule, as docs/security.md installs it
    assert rule.returncode == 0 and f"{LEAST_USER} ALL=(root) BOOTSTRAP_SANDBOX" in rule.stdout, rule.stderr
    subprocess.run(["docker", "exec", "-i", node3.container, "sh", "-c",
                    "cat > /etc/sudoers.d/bootstrap && chmod 440 /etc/sudoers.d/bootstrap && visudo -c"],
                   input=rule.stdout, text=True, check=True, capture_output=True)
    allowed = on_node(node3, "sudo", "-l", "-U", LEAST_USER).stdout  # what sudo itself says the user may run
    assert "/usr/sbin/nft list table inet bootstrap_sandbox" in allowed and " ALL\n" not in allowed, allowed
    firewalld_on(node3)  # its default zone rejects the other nodes: the port probe meets it, and names its fix
    blocked = cli("up", "--yes", "-i", inv)
    assert blocked.returncode == 3, blocked.stderr
    line = next(ln for ln in blocked.stderr.splitlines() if ln.startswith("error:"))
    assert f"{node3.name}: TCP port " in line and f"firewalld runs on {node3.name}" in line, line
    fix = line.split("`")[1]
    assert fix.startswith("sudo firewall-cmd --permanent --zone=trusted --add-source="), fix
    on_node(node3, "sh", "-c", fix.replace("sudo ", ""))  # the fix as printed (the node's root runs it)
    before = [nft_ruleset(n) for n in sandbox3.nodes]
    refused = cli("up", "--yes", "-i", inv)
    assert refused.returncode == 3, refused.stderr
    line = next(ln for ln in refused.stderr.splitlines() if ln.startswith("error:"))
    assert "preflight failed on 2 of 3 host(s) [node2, node3]" in line, line
    for n in sandbox3.nodes[1:]:
        assert f"{n.name}: the SSH user is not root and `sudo -n true` fails" in line, line
    assert "pass -K" in line and BECOME_ENV in line, line
    os.environ[BECOME_ENV] = "not-" + password
    wrong = cli("up", "--yes", "-i", inv)
    assert wrong.returncode == 3 and "sudo refused the become password" in wrong.stderr, wrong.stderr
    assert password not in wrong.stdout + wrong.stderr
    assert [nft_ruleset(n) for n in sandbox3.nodes] == before and not any(container_id(n) for n in sandbox3.nodes)
    os.environ[BECOME_ENV] = password
    up = cli("up", "--yes", "-i", inv)
    assert up.returncode == 0 and password not in up.stdout + up.stderr, up.stderr
    for n in sandbox3.nodes:  # the fence, put by sudo with the password on node2 and node3
        assert "table inet bootstrap_" in nft_tables(n), n.name
    # beside firewalld: its reload (and a complete one) leaves our table alone
    on_node(node3, "firewall-cmd", "--reload")
    on_node(node3, "firewall-cmd", "--complete-reload")
    assert "table inet firewalld" in nft_tables(node3) and "table inet bootstrap_" in nft_tables(node3)
    yield sandbox3, inv, password
    try:
        cli("serve", "-i", inv, "--stop", "--yes")
        down = cli("down", "--yes", "-i", inv)
        assert down.returncode == 0 and password not in down.stdout + down.stderr, down.stderr
        assert not any("table inet bootstrap_" in nft_tables(n) for n in sandbox3.nodes)
    finally:
        os.environ.pop(BECOME_ENV, None)
        firewalld_off(node3)
        on_node(node3, "rm", "-f", "/etc/sudoers.d/bootstrap")


def test_serve_with_no_flags_on_three_nodes_plans_from_the_model_and_answers(three):
    """The tiny model has 4 heads: TP=3 would be refused by vLLM, so the planner takes TP=1 PP=3,
    and the CPU cluster gets the native backend; status then shows what is served."""
    sb, inv, password = three
    nccl = cli("check-nccl", "-i", inv)  # on the mixed rack (two nodes as a user whose sudo asks a password)
    assert nccl.returncode == 0 and "PASS: all-reduce verified on 3 rank(s)" in nccl.stdout, nccl.stdout + nccl.stderr
    r = cli("serve", "-i", inv, MODEL, *PP_ARGS)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    # the plan comes before the launch, with the reason and each node's command
    assert "split:   TP=1 PP=3: 4 attention heads do not divide by 3 nodes" in lines, r.stdout
    assert any(ln.startswith("backend: native (CPU cluster") for ln in lines), r.stdout
    assert any(ln.startswith("model:   /opt/models/tiny-llama (4 attention heads, 4 layers") for ln in lines)
    for rank, n in enumerate(sb.nodes):
        cmd = next(ln for ln in lines if ln.strip().startswith(n.name + " "))
        assert f"--node-rank {rank}" in cmd and "--pipeline-parallel-size 3" in cmd, cmd
    assert lines.index("split:   TP=1 PP=3: 4 attention heads do not divide by 3 nodes") < next(
        i for i, ln in enumerate(lines) if ln.startswith("serving "))
    endpoint = f"http://{sb.nodes[0].ip}:8000/v1"
    assert f"serving {MODEL} on {endpoint} (backend native, TP=1, PP=3)" in r.stdout
    # not silent while vLLM starts: its steps, read from its own log, each on a line of its own (stderr)
    said = [ln.split(" waiting ", 1)[1] for ln in r.stderr.splitlines() if " vllm-start " in ln and " waiting " in ln]
    print("while vLLM started:", said)
    assert re.search(r" vllm-start +done \d+s$", r.stderr, re.M), r.stderr[-3000:]  # and when the wait ended
    assert said and said[0] == "vLLM starting (no output yet: importing vLLM and torch)", r.stderr[-3000:]
    assert any(x.startswith(("connecting the 3 ranks", "loading ", "weights loaded", "KV cache: ", "engine ready"))
               for x in said[1:]), said
    assert len(complete(endpoint, MODEL)) > 0
    for n in sb.nodes:
        assert vllm_procs(n), f"{n.name} runs its pipeline stage"

    st = cli("status", "-i", inv)
    assert st.returncode == 0, st.stderr
    assert f"serving: {MODEL} on {endpoint} healthy (backend native, TP=1 PP=3, 3 node(s), up " in st.stdout
    assert "KV cache: " in st.stdout and "Ray dashboard: http://127.0.0.1:8265 on node1 (from here: ssh -L" in st.stdout
    dr = cli("doctor", "-i", inv)
    assert dr.returncode == 0, dr.stdout + dr.stderr
    assert password not in "".join(x.stdout + x.stderr for x in (nccl, r, st, dr))
    js = json.loads(cli("status", "-i", inv, "--json").stdout)
    sv = js["serving"]
    assert (sv["model"], sv["backend"], sv["tp"], sv["pp"], sv["endpoint"], sv["health"]) == (
        MODEL, "native", 1, 3, endpoint, "healthy")
    assert sv["served"] == [MODEL] and sv["uptime_s"] >= 0 and sv["kv_cache_tokens"] > 0
    assert sv["nodes"] == [n.name for n in sb.nodes] and js["ray_dashboard"] == "127.0.0.1:8265"

    # An impossible explicit split is refused before anything starts: the server keeps serving.
    t = time.monotonic()
    bad = cli("serve", "-i", inv, MODEL, "--tp", "3", *PP_ARGS)
    assert bad.returncode == 2, bad.stderr
    assert time.monotonic() - t < 30
    assert "TP=3 PP=1 does not fit the model (4 attention heads, 4 layers): 4 attention heads do not divide " \
           "by TP=3; this cluster can serve it with TP=1 PP=3" in bad.stderr, bad.stderr
    assert len([ln for ln in bad.stderr.splitlines() if ln.startswith("error:")]) == 1
    assert " model-config " in bad.stderr and " stop-old " not in bad.stderr and " launch " not in bad.stderr
    eager = cli("serve", "-i", inv, MODEL, *VLLM_ARGS)
    assert eager.returncode == 2, eager.stderr
    assert "--enforce-eager with PP=3 on a CPU cluster" in eager.stderr and "pick a split with PP=1" in eager.stderr
    assert " stop-old " not in eager.stderr and " launch " not in eager.stderr
    assert len(complete(endpoint, MODEL)) > 0, "the refused serves touched nothing"

    # The fence (cluster.fence, on by default): a stranger on the nodes' network (no member, not this
    # machine) reaches SSH and the endpoint, nothing else the cluster listens on
    scan = stranger_scan(sb.nodes)
    opened = sorted(k for k, v in scan.items() if v == "open")
    assert opened == sorted([(n.ip, 22) for n in sb.nodes] + [(sb.nodes[0].ip, 8000)]), scan
    assert all(v == "refused" for k, v in scan.items() if v != "open"), scan
    # `status --exposure` says the same as the stranger found: open to anyone are SSH and the endpoint
    rep = cli("status", "-i", inv, "--exposure", "--json")
    assert rep.returncode == 0, rep.stderr
    rows = json.loads(rep.stdout)["listeners"]
    ips = {n.name: n.ip for n in sb.nodes}
    said = {(ips[x["host"]], x["port"]) for x in rows if x["reach"] == "anyone"}
    assert said == set(opened), (said, opened)
    assert {(ips[x["host"]], x["port"]) for x in rows if x["reach"] == "members"} <= {
        k for k, v in scan.items() if v == "refused"}
    wild = [(n.name, a, p) for n in sb.nodes for a, p in listeners(n) if a in ("0.0.0.0", "*", "::") and p != 22]
    print(f"wildcard listeners after serve (all fenced; docs/security.md says whose): {len(wild)}: {wild}")

    assert cli("serve", "-i", inv, "--stop", "--yes").returncode == 0
    assert all(vllm_procs(n) == [] for n in sb.nodes)
    gone = json.loads(cli("status", "-i", inv, "--json").stdout)
    assert gone["serving"] is None


def test_dry_run_prints_the_plan_starts_nothing_and_needs_no_secret(three, tmp_path):
    import os

    sb, inv, _ = three
    sec = write_inventory(inv, tmp_path / "sec.yaml", lambda d: d["cluster"].update(secrets=["BOOTSTRAP_T_SECRET"]))
    os.environ.pop("BOOTSTRAP_T_SECRET", None)
    real = cli("serve", "-i", sec, MODEL)
    assert real.returncode == 2 and "BOOTSTRAP_T_SECRET" in real.stderr  # a real run needs it
    r = cli("serve", "-i", sec, MODEL, "--dry-run", "--backend", "native", "--", "--max-model-len", "256")
    assert r.returncode == 0, r.stderr
    assert "split:   TP=1 PP=3: 4 attention heads do not divide by 3 nodes" in r.stdout
    assert "a real run needs BOOTSTRAP_T_SECRET set in your environment" in r.stdout
    assert r.stdout.rstrip().endswith("dry run: nothing was started")
    head_cmd = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith(sb.nodes[0].name + " "))
    assert head_cmd.rstrip().endswith("--host " + sb.nodes[0].ip + " --port 8000 --max-model-len 256"), head_cmd
    js = json.loads(cli("serve", "-i", sec, MODEL, "--dry-run", "--json").stdout)
    assert js["dry_run"] and (js["tp"], js["pp"], js["backend"]) == (1, 3, "native")
    assert js["config_source"] == "path" and js["model_shape"] == "4 attention heads, 4 layers"
    assert [n["host"] for n in js["nodes"]] == [n.name for n in sb.nodes]
    assert all(vllm_procs(n) == [] for n in sb.nodes)
    # read as the image's vLLM reads them (its own option table, after the hosts are reached and
    # before anything starts): an option it does not know, a short alias of what the plan sets
    for words, said in ((["--max-modle-len", "256"], "(did you mean --max-model-len?)"),
                        (["-n3"], "-n3 (vLLM reads it as --nnodes) is set by the serve plan")):
        r = cli("serve", "-i", sec, MODEL, "--dry-run", "--backend", "native", "--", *words)
        assert r.returncode == 2 and said in r.stderr, r.stderr[-2000:]
    assert all(vllm_procs(n) == [] for n in sb.nodes)


def test_vllm_failure_shows_vllms_own_cause_in_the_error_line_and_in_logs_and_doctor(three, tmp_path):
    """The tiny model allows 1024 positions; vLLM refuses more: the error line carries its words, and
    afterwards `bootstrap logs --serve` shows vLLM's own output (host and source on each line) and
    `bootstrap doctor` names the cause, where it read it, and the length the model allows. vLLM is
    started on the head alone (an inventory of node1 only): one vLLM fails as three would, for a third
    of the CPU; `logs` and `doctor` then read all three nodes."""
    sb, inv, _ = three
    head_only = write_inventory(inv, tmp_path / "head-only.yaml", lambda d: d.update(hosts=d["hosts"][:1]))
    r = cli("serve", "-i", head_only, MODEL, "--", "--max-model-len", "4096")
    assert r.returncode == 1, r.stderr[-2000:]
    err_line = next(ln for ln in r.stderr.splitlines() if ln.startswith("error:"))
    assert "vLLM exited after" in err_line and "max_model_len" in err_line and "4096" in err_line, err_line
    assert "Traceback" not in err_line
    assert all(vllm_procs(n) == [] for n in sb.nodes)

    lg = cli("logs", "-i", inv, "--serve", "--since", "15m", "--tail", "1000")
    assert lg.returncode == 0, lg.stderr
    cause = [ln for ln in lg.stdout.splitlines() if "max_model_len (4096)" in ln and "is greater than" in ln]
    assert [sb.nodes[0].name, "vllm"] in [ln.split()[:2] for ln in cause], lg.stdout[-3000:]
    only_node = cli("logs", "-i", inv, "--node", sb.nodes[0].name)
    assert only_node.returncode == 0 and only_node.stdout.strip(), only_node.stderr
    assert {ln.split()[0] + " " + ln.split()[1] for ln in only_node.stdout.splitlines()} == {f"{sb.nodes[0].name} node"}

    dr = cli("doctor", "-i", inv, "--json")
    found = [f for f in json.loads(dr.stdout)["findings"] if f["id"] == "max-model-len-too-long"]
    head = [f for f in found if (f["host"], f["source"]) == (sb.nodes[0].name, "vllm")]
    assert dr.returncode == 1 and head, dr.stdout[-3000:]
    assert "--max-model-len 1024" in head[0]["fix"], head


@pytest.fixture(scope="module")
def two(three, tmp_path_factory):
    """Two of the three nodes, as an inventory of their own (the 3-node Ray cluster stays up)."""
    sb, inv, _ = three
    inv2 = write_inventory(inv, tmp_path_factory.mktemp("serve") / "two.yaml", lambda x: x.update(hosts=x["hosts"][:2]))
    yield sb, inv, inv2
    cli("serve", "-i", inv2, "--stop", "--yes")


def test_ray_backend_on_cpu_is_refused_before_launch(two):
    sb, inv, inv2 = two
    t = time.monotonic()
    r = cli("serve", "-i", inv2, MODEL, "--backend", "ray", *VLLM_ARGS)
    took = time.monotonic() - t
    assert r.returncode == 2, r.stderr
    assert "--backend ray cannot serve on a CPU cluster" in r.stderr
    assert "current platform cpu does not support ray" in r.stderr.lower(), r.stderr[-3000:]
    assert took < 20, took
    assert vllm_procs(sb.nodes[0]) == []


def test_a_model_missing_on_a_node_is_refused_before_launch(two):
    """The copy itself (`--sync-model`) is proven in the Ray-less scenario below."""
    sb, inv, inv2 = two
    n1, n2 = sb.nodes[0], sb.nodes[1]
    on_node(n2, "docker", "exec", CONTAINER, "rm", "-rf", "/tmp/only-on-head")
    on_node(n1, "docker", "exec", CONTAINER, "cp", "-r", MODEL, "/tmp/only-on-head")
    r = cli("serve", "-i", inv2, "/tmp/only-on-head", "--backend", "native", *VLLM_ARGS)
    assert r.returncode == 3, r.stderr
    assert "node2" in r.stderr and "missing" in r.stderr
    assert vllm_procs(n1) == [] and vllm_procs(n2) == []
    # a hub model the head's container can neither find in its HF cache nor fetch (the sandbox reaches no hub):
    # vLLM would fail the same way after every node started, so it is refused first, in one line
    r = cli("serve", "-i", inv2, "someorg/no-such-model", "--backend", "native", *VLLM_ARGS)
    assert r.returncode == 3, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(
        "error: node1: someorg/no-such-model is not in the container's HF cache and the Hugging Face hub does not "
        "answer ("), r.stderr
    assert " launch " not in r.stderr and vllm_procs(n1) == [] and vllm_procs(n2) == []


def test_worker_cut_off_during_serve_is_named_and_nothing_is_left_running(two):
    """The wait runs out while node2 cannot reach the head; bootstrap's own probe from node2's
    container to the head names the cut (it does not depend on how far vLLM got)."""
    sb, inv, inv2 = two
    n1, n2 = sb.nodes[0], sb.nodes[1]
    cut = [["iptables", "-I", "INPUT", "-s", n1.ip, "-j", "DROP"],
           ["iptables", "-I", "OUTPUT", "-d", n1.ip, "-j", "DROP"]]
    for rule in cut:
        on_node(n2, *rule)
    try:
        t = time.monotonic()
        r = cli("serve", "-i", inv2, MODEL, "--backend", "native", "--timeout", "30", *VLLM_ARGS)
        took = time.monotonic() - t
    finally:
        on_node(n2, "iptables", "-F", "INPUT")
        on_node(n2, "iptables", "-F", "OUTPUT")
    assert r.returncode == 1, r.stderr[-2000:]
    err_line = next(ln for ln in r.stderr.splitlines() if ln.startswith("error:"))
    assert "not ready within 30s" in err_line and f"{n2.name}: " in err_line, err_line
    assert f"cannot reach the head {n1.ip}:" in err_line or f"likely cut off from {n1.ip}:" in err_line, err_line
    assert n1.name + ":" not in err_line.split("error:", 1)[1].split("cannot reach")[0].replace(n2.name, "")
    assert took < 30 + 60, took
    assert vllm_procs(n1) == [] and vllm_procs(n2) == []  # stopped on every node
    # Ray may have lost node2 during the cut: `up` heals the cluster.
    assert cli("up", "--yes", "-i", inv, "--timeout", "120").returncode == 0


def raw_stream(endpoint, model):
    """One streamed completion as vLLM sends it (the lines `bootstrap bench` parses)."""
    body = json.dumps({"model": model, "prompt": "The head starts first;", "max_tokens": 4, "temperature": 0,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(endpoint + "/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.read().decode()


def test_an_image_without_ray_serves_natively_with_a_secret_kept_off_argv_and_logs(two, tmp_path):
    """Stock vllm/vllm-openai images no longer ship Ray. With no `runtime` key, `up` reads the image
    (the sandbox's Ray-less variant), holds each node with `sleep infinity` instead of `ray start`,
    and `serve` runs vLLM's native multi-node mode, TP=2 over both nodes, with the model copied from
    the head (`--sync-model`), measured by `bench` (whose parser reads vLLM's raw stream). HF_TOKEN is marked secret
    throughout: delivered into the containers, never in any process's argv on the nodes (nested
    containers included) during plan, up and serve, nor in any output or log. Last, `runtime: ray`
    on this image is refused before anything changes, naming `runtime: none` first.

    One scenario, not four tests: each vLLM start costs a minute or two of CI."""
    import os
    import secrets as pysecrets
    import sys
    import threading

    import yaml

    from bootstrap.sandbox.cluster import push_ray_less
    from bootstrap.serve import benchload as BL
    from tests.support.sandbox import ROOT

    sb, three_nodes, inv2 = two
    password = os.environ[BECOME_ENV]  # node2 is the mixed rack's user whose sudo asks for it (three)
    nodes = sb.nodes[:2]
    cli("serve", "-i", inv2, "--stop", "--yes")
    assert cli("down", "--yes", "-i", three_nodes).returncode == 0  # the Ray image's cluster makes way
    name = "bootstrap-noray"
    image = push_ray_less(sb.workdir, log=lambda m: print(f"sandbox: {m}", flush=True))

    def no_ray(d):
        d["cluster"].update(image=image, container_name=name, secrets=["HF_TOKEN"])
        d["cluster"].pop("runtime", None)
    inv = write_inventory(inv2, tmp_path / "noray.yaml", no_ray)
    assert "runtime" not in yaml.safe_load(open(inv))["cluster"]
    token = "hf_SANDBOX" + pysecrets.token_hex(12)
    runs = tmp_path / "runs"  # the run logs of every command here, read for the secrets below
    env = {**os.environ, "HF_TOKEN": token, "BOOTSTRAP_RUNS": str(runs)}
    outputs = []

    def run(*args):
        t = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "bootstrap", *args], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=900)
        outputs.extend([r.stdout, r.stderr])
        print(f"$ bootstrap {' '.join(args)}  -> {r.returncode} in {time.monotonic() - t:.1f}s\n{r.stdout}\n{r.stderr}")
        return r

    all_cmdlines = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"
    argvs: list[str] = []
    # Every process's argv on both nodes (nested containers' included: one PID namespace tree), every
    # 0.5 s, by one long-lived `docker exec` per node: a new exec (and a `tr` per process) each
    # sample would cost the CPU that vLLM's start needs on this 2-core machine.
    stop_file = f"/tmp/.argv-sampler-stop-{pysecrets.token_hex(4)}"
    sampler = (f'end=$(($(date +%s) + 1200)); while [ ! -e {stop_file} ] && [ $(date +%s) -lt $end ]; do '
               'cat /proc/[0-9]*/cmdline 2>/dev/null | tr "\\0" " "; echo; echo =sample=; sleep 0.5; done; '
               f'rm -f {stop_file}')
    watchers = [subprocess.Popen(["docker", "exec", n.container, "sh", "-c", sampler], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True) for n in nodes]

    def read(proc):
        cur: list[str] = []
        for line in proc.stdout:
            if line.strip() == "=sample=":
                argvs.append("".join(cur))
                cur = []
            else:
                cur.append(line)

    readers = [threading.Thread(target=read, args=(p,), daemon=True) for p in watchers]
    for t in readers:
        t.start()
    try:
        plan = run("plan", "-i", inv)
        assert plan.returncode == 0 and "runtime: ray or none, decided from the image: `up` reads the image" in \
            plan.stdout, plan.stdout
        r = run("up", "--yes", "-i", inv, "--json")
        assert r.returncode == 0, r.stderr
        d = json.loads(r.stdout)
        assert d["runtime"] == "none" and d["runtime_why"].startswith("the image has no Ray (checked on node1)"), d
        assert "ray-in-image" in d["stages"] and "ray-ready" not in d["stages"], d["stages"]
        procs = on_node(nodes[1], "docker", "exec", name, "sh", "-c", all_cmdlines).stdout
        assert "raylet" not in procs and "gcs_server" not in procs and "sleep infinity" in procs

        # again: nothing to change, the image is not looked into twice (its marker on node1), and
        # the output speaks of node containers, not of a Ray cluster
        again = run("up", "--yes", "-i", inv)
        assert again.returncode == 0, again.stderr
        assert "runtime: none: the image has no Ray" in again.stdout, again.stdout
        assert "cluster already up: nothing changed: 2 node container(s) running, no Ray" in again.stdout
        assert "ray-in-image" not in again.stderr and "Ray cluster" not in again.stdout
        st = run("status", "-i", inv, "--json")
        js = json.loads(st.stdout)
        assert st.returncode == 0 and js["runtime"] == "none" and js["ray_dashboard"] is None, st.stdout
        assert [(x["container"], x["ray_alive"]) for x in js["nodes"]] == [("running", True), ("running", True)]

        # the model only on the head, in full; node2 holds its weights already, a stale file and a
        # different config: `--sync-model` copies node to node over the data network (the head's seed
        # container serves it), after which node2 holds the head's files only, and the weights were
        # not sent again (the same inode: not rewritten)
        copy = "/tmp/only-on-head"
        on_node(nodes[0], "docker", "exec", name, "cp", "-r", MODEL, copy)
        on_node(nodes[1], "docker", "exec", name, "sh", "-c",
                f"cp -r {MODEL} {copy} && cd {copy} && echo 0 > stale.bin && echo {{}} > config.json")
        weights = f"stat -c %i {copy}/*.safetensors"
        inode = on_node(nodes[1], "docker", "exec", name, "sh", "-c", weights).stdout
        r2 = run("serve", "-i", inv, copy, "--sync-model", "--json", *VLLM_ARGS)
        assert r2.returncode == 0, r2.stderr[-3000:]
        d2 = json.loads(r2.stdout)
        assert on_node(nodes[1], "docker", "exec", name, "sh", "-c", weights).stdout == inode != ""
        assert any(f"copied {copy}" in n and "(node2 from node1)" in n for n in d2["notes"]), d2["notes"]
        sums = f"cd {copy} && find . -type f | sort | xargs sha256sum"
        a, b = (on_node(n, "docker", "exec", name, "sh", "-c", sums).stdout for n in nodes)
        assert a == b and "safetensors" in a and "stale.bin" not in b and ".bootstrap-incoming" not in b
        assert (d2["backend"], d2["tp"], d2["pp"]) == ("native", 2, 1)
        assert d2["endpoint"] == f"http://{nodes[0].ip}:8000/v1" and d2["kv_cache_tokens"] > 0
        assert vllm_procs_in(nodes[1], name), "the second node runs a headless vLLM worker"
        assert len(complete(d2["endpoint"], d2["served"][0])) > 0

        # bench's parser on the exact lines vLLM sends: text chunks, a usage chunk, [DONE]
        raw = raw_stream(d2["endpoint"], d2["served"][0])
        print("raw vLLM stream:\n" + raw)
        parsed = [BL.parse_sse_line(ln) for ln in raw.splitlines()]
        objs = [p for p in parsed if isinstance(p, dict)]
        assert BL.DONE in parsed[-2:] and objs[-1]["choices"] == [] and objs[-1]["usage"]["completion_tokens"] == 4
        assert all(o["object"] == "text_completion" and {"index", "text", "finish_reason"} <= set(o["choices"][0])
                   for o in objs[:-1])
        timer = BL.StreamTimer(0.0)
        for i, ln in enumerate(raw.splitlines()):
            timer.feed(ln, 0.001 * i)
        sample = timer.sample(1.0)
        assert sample.ok and sample.output_tokens == 4 and sample.ttft is not None
        # bench against the 2-node endpoint: bounded, streaming, percentiles and a PNG
        png = tmp_path / "bench.png"
        b = run("bench", "-i", inv, "--requests", "16", "--concurrency", "4", "--max-tokens", "16", "--ignore-eos",
                "--png", str(png), "--json")
        assert b.returncode == 0, b.stderr
        res = json.loads(b.stdout)
        assert (res["model"], res["ok"], res["failed"], res["output_tokens"]) == (copy, 16, 0, 16 * 16), res
        for k in ("ttft_ms", "itl_ms", "e2e_ms"):
            assert 0 < res[k]["p50"] <= res[k]["p95"] <= res[k]["p99"], (k, res[k])
        assert res["ttft_ms"]["p50"] <= res["e2e_ms"]["p50"] and res["requests_per_s"] > 0
        assert png.read_bytes()[:4] == b"\x89PNG"

        import hashlib
        digest = hashlib.sha256(token.encode()).hexdigest()
        for n in nodes:  # delivered (so the checks below can fail): the container's PID 1 and vLLM have it,
            # read from the file on the node's tmpfs; compared by digest (the value stays off argv here too)
            for pid in ("1", "$(cat /tmp/bootstrap-vllm-serve.pid)"):
                got = on_node(n, "docker", "exec", name, "sh", "-c", f'tr "\\0" "\\n" < /proc/{pid}/environ | '
                              'sed -n "s/^HF_TOKEN=//p" | tr -d "\\n" | sha256sum', check=False).stdout.split()
                assert got[:1] == [digest], (n.name, pid, got)

        bad = run("serve", "-i", inv, "/opt/models/does-not-exist")
        assert bad.returncode != 0  # an error path, whose message must not carry the secret either
    finally:
        for n in nodes:  # the sampling loop in each node ends at its next turn
            on_node(n, "touch", stop_file, check=False)
        for p in watchers:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        for t in readers:
            t.join(30)
        run("serve", "-i", inv, "--stop", "--yes")
    try:
        samples = len(argvs)
        logs = [on_node(n, "docker", "logs", name, check=False) for n in nodes]
        serve_logs = [on_node(n, "docker", "exec", name, "cat", "/tmp/bootstrap-vllm-serve.log", check=False).stdout
                      for n in nodes]
        leftovers = [on_node(n, "sh", "-c", "ls -a /tmp | grep '^.bootstrap-' || true").stdout.strip() for n in nodes]
        for n in nodes:
            inspected = on_node(n, "docker", "inspect", name).stdout
            assert token not in inspected and password not in inspected  # never in Docker's records
        print(f"{samples} argv snapshots of both nodes taken during plan/up/serve")
        assert samples >= 20 and any("vllm serve" in a or "VLLM" in a for a in argvs)
        assert not [a for a in argvs if token in a], "the secret appeared in a process argv on a node"
        assert not [a for a in argvs if password in a], "the sudo password appeared in a process argv on a node"
        assert not [o for o in outputs if token in o or password in o], "a secret appeared in the tool's output"
        run_logs = [p.read_text() for p in runs.rglob("*") if p.is_file()]
        assert run_logs and not [x for x in run_logs if token in x or password in x], "a secret in the run log"
        assert not [x for x in logs if token in x.stdout + x.stderr] and not [x for x in serve_logs if token in x]
        assert serve_logs[0], "the head's serve log was read (so the check above can fail)"
        assert leftovers == ["", ""], leftovers  # the 0600 env files were removed after docker run

        # cluster.runtime: ray on this image: refused at preflight, the nodes' containers untouched
        ray = write_inventory(inv, tmp_path / "ray.yaml", lambda x: x["cluster"].update(runtime="ray"))
        before = [on_node(n, "docker", "inspect", "-f", "{{.Id}}", name).stdout for n in nodes]
        r = run("up", "--yes", "-i", ray)
        assert r.returncode == 3, r.stderr
        assert "`ray` is not in the image" in r.stderr and "set cluster.runtime: none" in r.stderr, r.stderr
        assert r.stderr.index("set cluster.runtime: none") < r.stderr.index("pip install 'ray[default]'"), r.stderr
        assert [on_node(n, "docker", "inspect", "-f", "{{.Id}}", name).stdout for n in nodes] == before
    finally:
        assert run("down", "--yes", "-i", inv).returncode == 0
