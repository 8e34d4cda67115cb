"""Inventory errors in plain words (issue 51, point 10): YAML syntax errors as `FILE:LINE:COL:` and what
to change, not PyYAML's parser words; misspelt Ansible variables refused; did-you-mean prefers the
field a common alias names (`ipaddr` -> `ip`)."""
import pathlib
import textwrap

import pytest

from bootstrap.errors import InventoryError
from bootstrap.inventory import load_inventory

PARSER_WORDS = ("mapping values are not allowed", "expected <block end>", "block mapping start",
                "could not find expected", "while parsing", "while scanning", "<scalar>", "found '?'")


def error(tmp_path: pathlib.Path, text: str) -> str:
    path = tmp_path / "hosts.yaml"
    path.write_text(textwrap.dedent(text))
    with pytest.raises(InventoryError) as info:
        load_inventory(path, {}, check_files=False)
    text = str(info.value)
    assert "\n" not in text
    assert not any(w in text for w in PARSER_WORDS), text
    return text.removeprefix(str(path))


@pytest.mark.parametrize("text, where, words", [
    # a key indented less than its siblings
    ("hosts:\n  - name: gpu-a\n    address: 10.0.0.11\n   ip: 10.0.0.12\n", ":4:4:", "indented differently"),
    ("hosts:\n  - name: gpu-a\n  address: 10.0.0.11\n", ":3:3:", "indented differently"),
    # a key indented more than the key above it
    ("cluster:\n  image: a\n   name: b\nhosts: []\n", ":3:", "indented differently"),
    # no space after ':'
    ("hosts:\n  - name:gpu-a\n    address: 10.0.0.11\n", ":2:", "needs a space after it"),
    ("hosts:\n  - name: a\n    address:10.0.0.1\n    ip: 10.0.0.2\n", ":3:", "needs a space after it"),
    # a value with ': ' in it
    ("cluster:\n  image: a: b\nhosts: []\n", ":2:", "quote the value"),
    # a tab
    ("hosts:\n  - name: gpu-a\n\taddress: 10.0.0.11\n", ":3:1:", "a tab is used for indentation"),
    # an unclosed [ and an unclosed quote
    ("cluster:\n  mounts: [/a:/b, /c:/d\nhosts:\n  - name: a\n", ":", "'[' opened on line 2"),
    ("hosts:\n- name: a\n  address: \"x\n", ":", "opened on line 3"),
])
def test_yaml_syntax_error_in_plain_words(tmp_path, text, where, words):
    message = error(tmp_path, text)
    assert message.startswith(where), message
    assert words in message, message


def test_yaml_syntax_error_names_line_and_column(tmp_path):
    message = error(tmp_path, "hosts:\n  - name: gpu-a\n    address: 10.0.0.11\n   ip: 10.0.0.12\n")
    assert message.startswith(":4:4: invalid YAML: "), message
    assert "line 3" in message  # the key it should line up with


ANSIBLE = """\
all:
  vars:
    bootstrap: {{accelerator: none}}
  hosts:
    gpu-a:
      ansible_host: 10.0.0.11
      {var}: x
"""


@pytest.mark.parametrize("var, want", [("ansible_hots", "ansible_host"), ("ansible_usr", "ansible_user"),
                                       ("ansible_prot", "ansible_port"),
                                       ("ansible_ssh_private_keyfile", "ansible_ssh_private_key_file")])
def test_ansible_typo_is_refused_with_did_you_mean(tmp_path, var, want):
    message = error(tmp_path, ANSIBLE.format(var=var))
    assert message.startswith(":7: "), message
    assert repr(var) in message and f"did you mean {want!r}" in message, message


@pytest.mark.parametrize("var", ["ansible_python_interpreter", "ansible_connection", "ansible_ssh_pipelining",
                                 "ansible_shell_type"])
def test_ansible_variables_ansible_knows_are_still_accepted(tmp_path, var):
    path = tmp_path / "hosts.yaml"
    path.write_text(ANSIBLE.format(var=var).replace(": x", ": ssh" if var == "ansible_connection" else ": x"))
    inv = load_inventory(path, {}, check_files=False)
    assert [h.name for h in inv.hosts] == ["gpu-a"]


@pytest.mark.parametrize("key, want", [("ipaddr", "ip"), ("ip_addr", "ip"), ("ip_address", "ip"),
                                       ("data_ip", "ip"), ("hostname", "address"), ("host", "address")])
def test_did_you_mean_prefers_the_alias(tmp_path, key, want):
    message = error(tmp_path, f"cluster: {{accelerator: none}}\nhosts:\n  - {{name: a, address: 10.0.0.1, {key}: x}}\n")
    assert f"unknown key {key!r} (did you mean {want!r}?)" in message, message
