"""The one `docker run`/`docker create` builder (bootstrap.remote.argv): its word order, its option
helpers, and that it stays pure (the pure plans import it)."""
import ast
from pathlib import Path

from bootstrap.remote import argv as RA


def test_the_builder_puts_every_part_in_dockers_order():
    spec = RA.RunSpec("img:1", "c", detach=True, options=("--network", "host"), entrypoint="ray",
                      command=("start", "--block"))
    assert RA.docker_argv(spec) == ("docker", "run", "-d", "--name", "c", "--network", "host", "--entrypoint", "ray",
                                    "img:1", "start", "--block")
    assert RA.docker_argv(RA.RunSpec("img", create=True, name="k")) == ("docker", "create", "--name", "k", "img")
    assert RA.docker_argv(RA.RunSpec("img", rm=True, interactive=True, command=("-c", "x"))) == (
        "docker", "run", "--rm", "-i", "img", "-c", "x")


def test_the_option_helpers():
    assert RA.labels({"a": "1", "b": "x y"}) == ("--label", "a=1", "--label", "b=x y")
    assert RA.labels([("a", "1")]) == ("--label", "a=1")
    assert RA.env([("K", "v=w")]) == ("-e", "K=v=w")
    assert RA.volumes("/a:/b:ro", "v:/c") == ("-v", "/a:/b:ro", "-v", "v:/c")
    assert RA.caps() == ("--cap-drop", "ALL")
    assert RA.hardened("NET_RAW", "SETUID") == ("--cap-drop", "ALL", "--cap-add", "NET_RAW", "--cap-add", "SETUID",
                                                "--security-opt", "no-new-privileges")
    assert RA.sh_in_image_argv("img", "echo x") == ("docker", "run", "--rm", "--network", "none", "--entrypoint", "sh",
                                                   "img", "-c", "echo x")
    assert RA.container_inspect_cmd("c") == ("docker", "container", "inspect", "c")


def test_it_is_pure_it_imports_nothing_but_the_standard_librarys_typing():
    """The pure plans import it (tests/test_architecture.py allows that of this module alone): it
    must never reach the session, SSH or a host."""
    tree = ast.parse(Path(RA.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "dataclasses", "typing"}
    package_init = Path(RA.__file__).with_name("__init__.py")
    assert not [n for n in ast.walk(ast.parse(package_init.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))]


def test_the_other_docker_commands_are_written_word_for_word():
    assert RA.info_argv("{{.ServerVersion}}") == ("docker", "info", "--format", "{{.ServerVersion}}")
    assert RA.inspect_argv("c", "img", fmt="{{json .}}") == ("docker", "inspect", "--format", "{{json .}}", "c", "img")
    assert RA.image_inspect_argv("img", "{{.Id}}") == ("docker", "image", "inspect", "--format", "{{.Id}}", "img")
    assert RA.pull_argv("r/i:1") == ("docker", "pull", "--quiet", "r/i:1")
    assert RA.load_argv() == ("docker", "load", "--quiet")
    assert RA.image_rm_argv("img") == ("docker", "image", "rm", "img")
