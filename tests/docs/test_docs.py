"""The README and the documentation site say only what is true of this checkout: the site builds with
`mkdocs build --strict` (a broken link, anchor or missing page fails), every repository path they name
exists, every `bootstrap ...` command line they show parses (its command and options exist), and
every inventory snippet validates."""
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import click
import pytest
import yaml

from bootstrap.cli import main

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("bootstrap", "checks", "scripts", "tests", "docs", "perf", "inventory", "dashboards", ".ci")
PATH = re.compile(r"`((?:%s)/[\w./-]*[\w/])`" % "|".join(re.escape(t) for t in TOP))
#: A fenced block, at the margin or indented (inside an admonition or a content tab: `=== "Native"`).
FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.M | re.S)


def rel(p):
    return str(p.relative_to(ROOT))


def fences(text):
    """(language, body) of every fenced block of a page, its body dedented as it would stand alone."""
    for m in FENCE.finditer(text):
        yield m.group(2), textwrap.dedent(m.group(3))


def test_the_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra (pip install '.[docs]'); scripts/dev-setup.sh installs it")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    cli = (tmp_path / "site" / "cli" / "index.html").read_text()
    for name in main.commands:  # the generated reference covers every command
        assert f"bootstrap {name}" in cli, name
    trouble = (tmp_path / "site" / "troubleshooting" / "index.html").read_text()
    from bootstrap.signatures import SIGNATURES
    assert all(f"<code>{s.id}</code>" in trouble for s in SIGNATURES)


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_path_a_page_names_exists(page):
    text = page.read_text()
    named = set(PATH.findall(text))
    links = {m for m in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text) if not m.startswith("http")}
    missing = sorted(n for n in named if not (ROOT / n).exists())
    missing += sorted(f"link {m}" for m in links if not (page.parent / m).exists())
    assert missing == [], f"{rel(page)} names what is not in the checkout"


def _command_lines(text):
    for lang, body in fences(text):
        if lang in ("bash", "console", "sh", ""):
            for line in body.splitlines():
                line = line.strip().removeprefix("$ ")
                if line.startswith("bootstrap "):
                    yield line
    for m in re.finditer(r"`(bootstrap [^`]+)`", text):
        yield m.group(1)


def _check(line):
    """'' when the command line parses: its command path exists and each option is one of its own."""
    try:
        words = shlex.split(line, comments=True)[1:]
    except ValueError as exc:
        return f"does not parse as a shell command line: {exc}"
    cut = [i for i, w in enumerate(words) if w in ("|", "&&", ";", ">", "||")]
    words = words[:cut[0]] if cut else words
    cmd, path = main, ["bootstrap"]
    while isinstance(cmd, click.Group) and words and words[0] in cmd.commands:
        cmd = cmd.commands[words.pop(0)]
        path.append(cmd.name)
    if isinstance(cmd, click.Group):
        return "" if not words or words[0].startswith("-") or words[0] in ("COMMAND", "...") else \
            f"no command {words[0]!r} under {' '.join(path)}"
    opts = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help", "-h"}
    for w in words:
        if w == "--":
            break
        if w.startswith("-") and not w.startswith("-- ") and w.split("=")[0] not in opts and w != "-":
            return f"{' '.join(path)} has no option {w.split('=')[0]}"
    return ""


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_command_line_a_page_shows_parses(page):
    lines = list(_command_lines(page.read_text()))
    bad = [f"{ln}: {why}" for ln in lines if (why := _check(ln))]
    assert bad == [], bad


def test_the_command_line_check_can_fail():
    assert _check("bootstrap up -i hosts.yaml --json") == ""
    assert "has no option --jsn" in _check("bootstrap up -i hosts.yaml --jsn")
    assert "no command 'upp'" in _check("bootstrap upp -i hosts.yaml")
    assert _check("bootstrap exec -i h.yaml -- nvidia-smi --weird") == ""


def _inventory_snippets():
    for page in PAGES:
        for lang, body in fences(page.read_text()):
            if lang == "yaml":
                doc = yaml.safe_load(body)
                if isinstance(doc, dict) and ("hosts" in doc or "all" in doc):
                    yield pytest.param(body, id=f"{rel(page)}:{body.splitlines()[0][:30]}")


@pytest.mark.parametrize("body", list(_inventory_snippets()))
def test_every_inventory_snippet_validates(body, tmp_path):
    from bootstrap.inventory import load_inventory

    path = tmp_path / "hosts.yaml"
    path.write_text(body)
    secrets = re.findall(r"\b[A-Z][A-Z0-9_]*(?:TOKEN|KEY|SECRET)\w*", body)
    load_inventory(path, {s: "x" for s in secrets}, check_files=False)


def test_there_are_snippets_to_check():
    assert len(list(_inventory_snippets())) >= 2
    assert sum(len(list(_command_lines(p.read_text()))) for p in PAGES) >= 40
