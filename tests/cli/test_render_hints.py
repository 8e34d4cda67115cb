"""The hints the CLI prints for reaching a service from this machine (cli/render.py, pure)."""
from bootstrap.cli import render
from bootstrap.model import Host, SSHTarget


def _host(address, **ssh):
    return Host(name="gpu-a", ssh=SSHTarget(address=address, **ssh), ip=address.strip("[]"), role="head")


def test_the_ssh_tunnel_hint_carries_the_inventorys_port_jump_and_key_and_brackets_ipv6():
    h = _host("10.0.0.5", user="ops", port=2222, key="/keys/id ed25519", jump="ops@bastion:2200")
    assert render._ssh_tunnel(h, "127.0.0.1", 8265) == (
        "from here: ssh -L 8265:127.0.0.1:8265 -p 2222 -J ops@bastion:2200 -i '/keys/id ed25519' ops@10.0.0.5, "
        "then http://localhost:8265")
    v6 = _host("fd00::5")
    assert render._ssh_tunnel(v6, "fd00::5", 9090) == (
        "from here: ssh -L '9090:[fd00::5]:9090' fd00::5, then http://localhost:9090")


def test_the_dashboard_line_brackets_an_ipv6_address():
    h = _host("fd00::5")
    # (rich markup: a literal '[' is escaped in the line printed)
    line = render._dashboard_line("Ray dashboard", "fd00::5:8265", h).replace("\\[", "[")
    assert line == "Ray dashboard: http://[fd00::5]:8265"
    line = render._dashboard_line("Ray dashboard", "127.0.0.1:8265", _host("10.0.0.5"))
    assert line.startswith("Ray dashboard: http://127.0.0.1:8265 on gpu-a (from here: ssh -L 8265:127.0.0.1:8265")
