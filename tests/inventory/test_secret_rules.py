"""Where a secret may go (bootstrap/inventory/secretrules.py): names every process reads or the plan
sets, names too long for their file, blank values, VLLM_API_KEY twice, one secret in two roles whose
exposure differs (by name and by value), VRRP passwords keepalived cannot take whole. Each refusal is
one line naming the file:line and the field, and never shows a value."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from bootstrap.cli import main
from bootstrap.model import PLAN_ENV
from tests.support.fleet_inventories import error, fleet_yaml, line_of, load, write

VALUE = "hf_SameValueAsEverywhere1234"


def one_host(cluster: str) -> str:
    return f"cluster: {{accelerator: none, {cluster}}}\nhosts: [{{name: a, address: 10.0.0.1}}]\n"


def check(err, field: str, *parts: str, line: int | None = None, hidden: tuple[str, ...] = (VALUE,)):
    text = str(err)
    assert err.field == field and "\n" not in text, text
    assert line is None or err.line == line, text
    for part in parts:
        assert part in text, (part, text)
    for value in hidden:
        assert value not in text, text


@pytest.mark.parametrize("name", sorted(PLAN_ENV))
def test_every_variable_the_plan_sets_is_refused_in_env_and_secrets_alike(tmp_path, name):
    err_env = error(tmp_path, one_host(f"env: {{{name}: x}}"), {})
    err_secret = error(tmp_path, one_host(f"secrets: [{name}]"), {name: "x"})
    assert err_env.message == err_secret.message and f"{name} is set by bootstrap from" in err_env.message
    assert (err_env.field, err_secret.field) == ("cluster.env", "cluster.secrets")
    host = error(tmp_path, "cluster: {accelerator: none}\n"
                           f"hosts: [{{name: a, address: 10.0.0.1, env: {{{name}: x}}}}]\n", {})
    assert host.message == err_env.message


def test_the_plan_env_table_holds_every_variable_a_planned_container_is_given(tmp_path):
    """Derived from the plan itself: every `-e` of a node and a serve container of a disaggregated fleet
    with Ray's token is in model.PLAN_ENV or PLAN_DEFAULT_ENV (or the host's env)."""
    from bootstrap.cluster import plan as PL
    from bootstrap.fleet import plan as FP
    from bootstrap.model import PLAN_DEFAULT_ENV

    inv = load(tmp_path, fleet_yaml(cluster="router: {prefill: [0]}", extra={0: "env: {MY_VAR: '1'}"}), {})
    node = PL.container_spec(FP.replica_inventory(inv, 0), inv.hosts[0], 1024, auth=("/t", "d")).run_argv()
    member = FP.member_create_argv(inv, inv.hosts[0], 1024, replica=0, rank=0, nodes=2, vllm=["x"],
                                   spec=FP.Spec("m"), ucx={"UCX_NET_DEVICES": "mlx5_0:1", FP.CPU_BIND_ENV: "nobind"})
    for argv in (node, member):
        names = {argv[i + 1].split("=", 1)[0] for i, a in enumerate(argv) if a == "-e"}
        assert names - set(PLAN_ENV) - set(PLAN_DEFAULT_ENV) == {"MY_VAR"}, names
    assert set(PL.COMPILE_ENV) | set(PL.DERIVED_VARS) <= set(PLAN_DEFAULT_ENV)


@pytest.mark.parametrize("name, says", [
    ("PATH", "read by every process of the containers"), ("PYTHONPATH", "read by every process"),
    ("LD_PRELOAD", "the dynamic linker"), ("HOME", "read by every process"), ("IFS", "read by every process"),
    ("NCCL_SOCKET_IFNAME", "set by bootstrap per node"), ("VLLM_CACHE_ROOT", "set by bootstrap per node"),
    ("VLLM_CPU_OMP_THREADS_BIND", "set by bootstrap per node"),
    # Python's newer variables (with `_`), and the C library's
    ("PYTHON_GIL", "or Python"), ("PYTHON_CPU_COUNT", "or Python"), ("GLIBC_TUNABLES", "the C library"),
    ("MALLOC_ARENA_MAX", "the C library"), ("GCONV_PATH", "the C library"),
    ("A" * 251, "each secret is a file of its name on the hosts, at most 250"),
])
def test_a_secret_name_every_process_reads_the_plan_sets_or_too_long_for_its_file_is_refused(tmp_path, name, says):
    path = write(tmp_path, one_host(f"secrets: [OK_TOKEN, {name}]"))
    err = error(tmp_path, one_host(f"secrets: [OK_TOKEN, {name}]"), {name: "v", "OK_TOKEN": "o"})
    check(err, "cluster.secrets", says, line=1)
    assert str(err).startswith(f"{path}:1: cluster.secrets: ")
    if len(name) > 100:
        assert name not in str(err)


def test_a_name_the_plan_defaults_stays_allowed_in_env_and_a_long_name_within_the_bound_as_a_secret(tmp_path):
    assert load(tmp_path, one_host("env: {NCCL_SOCKET_IFNAME: eth0}"), {}).cluster.env == (("NCCL_SOCKET_IFNAME",
                                                                                             "eth0"),)
    name = "A" * 250
    assert [s.name for s in load(tmp_path, one_host(f"secrets: [{name}]"), {name: "v"}).cluster.secrets] == [name]


@pytest.mark.parametrize("blank", [" ", "  \t ", "\u00a0"])
def test_a_blank_secret_is_refused_like_an_empty_one(tmp_path, blank):
    err = error(tmp_path, one_host("secrets: [MY_TOKEN]"), {"MY_TOKEN": blank})
    check(err, "cluster.secrets", "MY_TOKEN is set but blank in your environment")
    # HF_TOKEN, a secret by default when set: blank is unset, like empty
    assert load(tmp_path, one_host("gpus_per_node: 0"), {"HF_TOKEN": blank}).cluster.secrets == ()


def test_vllm_api_key_with_two_values_is_refused(tmp_path):
    text = fleet_yaml(cluster="secrets: [VLLM_API_KEY, FLEET_KEY]\nrouter: {api_key: FLEET_KEY}")
    path = write(tmp_path, text)
    err = error(tmp_path, text, {"VLLM_API_KEY": "a", "FLEET_KEY": "b"})
    check(err, "cluster.router.api_key", "VLLM_API_KEY is listed in cluster.secrets too",
          "set api_key: VLLM_API_KEY", line=line_of(path, "api_key"), hidden=("a=", "b="))
    assert load(tmp_path, fleet_yaml(cluster="secrets: [VLLM_API_KEY]\nrouter: {api_key: VLLM_API_KEY}"),
                {"VLLM_API_KEY": "k"}).cluster.router.api_key == "VLLM_API_KEY"


VIP = "vip: {address: 10.0.0.100, secret: %s}"


@pytest.mark.parametrize("cluster, field, roles", [
    ("secrets: [HF_TOKEN]\nrouter: {%s}" % (VIP % "HF_TOKEN"), "cluster.router.vip.secret",
     ("VRRP's password", "the Hugging Face token")),
    ("secrets: [K]\nrouter: {api_key: K, %s}" % (VIP % "K"), "cluster.router.vip.secret",
     ("VRRP's password", "the API key")),
    ("secrets: [VLLM_API_KEY]\nrouter: {%s}" % (VIP % "VLLM_API_KEY"), "cluster.router.vip.secret",
     ("VRRP's password", "the API key")),
    ("secrets: [HF_TOKEN]\nrouter: {api_key: HF_TOKEN}", "cluster.router.api_key",
     ("the API key", "the Hugging Face token")),
])
def test_a_secret_named_in_two_roles_exposed_differently_is_refused(tmp_path, cluster, field, roles):
    text = fleet_yaml(cluster=cluster)
    path = write(tmp_path, text)
    needle = "secret:" if field.endswith("vip.secret") else "api_key"
    err = error(tmp_path, text, {"HF_TOKEN": VALUE, "K": VALUE, "VLLM_API_KEY": VALUE})
    check(err, field, *roles, "one secret in two roles", line=line_of(path, needle))
    # offline too (`plan` has no values): by name
    err = error(tmp_path, text, {}, require_secrets=False)
    assert err.field == field and "one secret in two roles" in str(err)


@pytest.mark.parametrize("cluster, field, roles", [
    ("secrets: [HF_TOKEN, VRRP_PASS]\nrouter: {%s}" % (VIP % "VRRP_PASS"), "cluster.router.vip.secret",
     ("VRRP_PASS has the same value as HF_TOKEN", "VRRP's password", "the Hugging Face token")),
    ("secrets: [FLEET_KEY, VRRP_PASS]\nrouter: {api_key: FLEET_KEY, %s}" % (VIP % "VRRP_PASS"),
     "cluster.router.vip.secret", ("VRRP_PASS has the same value as FLEET_KEY", "the API key")),
    ("secrets: [HF_TOKEN, FLEET_KEY]\nrouter: {api_key: FLEET_KEY}", "cluster.router.api_key",
     ("FLEET_KEY has the same value as HF_TOKEN", "held by every client")),
    ("secrets: [WANDB_API_KEY, FLEET_KEY]\nrouter: {api_key: FLEET_KEY}", "cluster.router.api_key",
     ("FLEET_KEY has the same value as WANDB_API_KEY", "a secret of the serving containers")),
])
def test_two_secrets_with_one_value_in_roles_exposed_differently_are_refused_unseen(tmp_path, cluster, field, roles):
    pw = "pw4vrrp"
    names = ("HF_TOKEN", "VRRP_PASS", "FLEET_KEY", "WANDB_API_KEY")
    err = error(tmp_path, fleet_yaml(cluster=cluster), dict.fromkeys(names, pw))
    check(err, field, *roles, "values are never shown", hidden=(pw,))


def test_secrets_of_one_role_may_share_a_value_and_distinct_values_pass(tmp_path):
    inv = load(tmp_path, one_host("secrets: [HF_TOKEN, HUGGING_FACE_HUB_TOKEN]"),
               {"HF_TOKEN": VALUE, "HUGGING_FACE_HUB_TOKEN": VALUE})
    assert len(inv.cluster.secrets) == 2
    text = fleet_yaml(cluster="secrets: [HF_TOKEN, FLEET_KEY, VRRP_PASS]\n"
                              "router: {api_key: FLEET_KEY, %s}" % (VIP % "VRRP_PASS"))
    inv = load(tmp_path, text, {"HF_TOKEN": VALUE, "FLEET_KEY": "sk-other-0001", "VRRP_PASS": "pw4vrrp"})
    assert inv.cluster.router.vip.secret == "VRRP_PASS"


@pytest.mark.parametrize("pw, says", [
    ("123456789", "is 9 bytes: keepalived sends only the first 8"),
    ("pässwör", "is 9 bytes"),
    ("two word", "is not one word keepalived reads whole"),
    ("#comment", "not starting with '#'"),
    ('a"b', "is not one word"), ("a'b", "is not one word"), ("a$b", "is not one word"), ("{x}", "is not one word"),
])
def test_a_vrrp_password_keepalived_cannot_take_whole_is_refused_with_the_reason(tmp_path, pw, says):
    text = fleet_yaml(cluster="secrets: [VRRP_PASS]\nrouter: {%s}" % (VIP % "VRRP_PASS"))
    path = write(tmp_path, text)
    err = error(tmp_path, text, {"VRRP_PASS": pw})
    check(err, "cluster.router.vip.secret", "VRRP_PASS in your environment", says, line=line_of(path, "secret:"),
          hidden=(pw,))


def test_a_refused_secret_exits_2_in_one_line_before_anything_is_contacted(tmp_path, monkeypatch):
    path = write(tmp_path, fleet_yaml(cluster="secrets: [HF_TOKEN]\nrouter: {%s}" % (VIP % "HF_TOKEN")))
    monkeypatch.setenv("HF_TOKEN", VALUE)
    touched = []
    monkeypatch.setattr("bootstrap.remote.ssh.SSHHost.connect", lambda self: touched.append(self.name))
    r = CliRunner().invoke(main, ["up", "-i", str(path)])
    assert r.exit_code == 2, r.output
    out = r.output.strip()
    assert "cluster.router.vip.secret" in out and "one secret in two roles" in out and VALUE not in out
    assert len(out.splitlines()) == 1 and "Traceback" not in out and touched == []
