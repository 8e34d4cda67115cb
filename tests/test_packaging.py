"""setup.cfg lists its packages by hand: every package of the source tree must be in the list, or a
wheel (`pip install .` without -e) ships without it and fails on import."""
import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_of_the_tree_is_in_setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = {p.strip() for p in cfg["options"]["packages"].split() if p.strip()}
    tree = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "bootstrap").rglob("__init__.py")}
    assert tree - listed == set(), "packages missing from setup.cfg [options] packages"
    mapped = {line.split("=")[0].strip() for line in cfg["options"]["package_dir"].splitlines() if "=" in line}
    assert listed - tree == mapped, "setup.cfg lists a package that is neither in the tree nor mapped by package_dir"


def test_every_install_hint_names_an_extra_this_project_has():
    """A hint `pip install 'X[extra]'` (the --png one, issue 51 point 10) installs from this checkout
    ('.[extra]': the project is installed from a clone, not published to an index, so
    'bootstrap-vllm[png]' would ask PyPI for someone else's package) and names an extra of setup.cfg."""
    import configparser
    import re

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    extras = set(cfg["options.extras_require"])
    hint = re.compile(r"pip install '([^'\[\s]*)\[([a-z0-9_,-]+)\]'")
    seen, wrong = 0, []
    files = [*ROOT.glob("bootstrap/**/*.py"), *ROOT.glob("perf/*.py"), *ROOT.glob("docs/*.md"), ROOT / "README.md",
             ROOT / "setup.cfg"]
    for f in files:
        for m in hint.finditer(f.read_text()):
            if m[1] not in (".", "") and "bootstrap" not in m[1]:
                continue  # another project's extra ('ray[default]')
            seen += 1
            if m[1] != "." or not set(m[2].split(",")) <= extras:
                wrong.append(f"{f.relative_to(ROOT)}: {m[0]}")
    assert seen >= 4 and wrong == [], wrong


#: what the repository's root holds: the layout the mission names (bootstrap/, inventory/, scripts/, checks/,
#: tests/, setup.cfg, README.md), the docs and their site, the benchmarks, the dashboards and the CI entry
ROOT_ENTRIES = {".ci", ".gitignore", "README.md", "bootstrap", "checks", "dashboards", "docs", "inventory",
                "mkdocs.yml", "perf", "pyproject.toml", "scripts", "setup.cfg", "tests"}


def test_the_root_holds_the_layout_and_nothing_a_run_left_behind():
    """Issue 67: router.pid and bringup.png had been committed at the root (a benchmark's plot, a pid file)."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    top = {line.split("/")[0] for line in tracked.splitlines() if line}
    assert top - ROOT_ENTRIES == set(), sorted(top - ROOT_ENTRIES)
