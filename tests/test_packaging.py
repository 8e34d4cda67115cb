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
