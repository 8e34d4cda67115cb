"""mkdocs hook: the pages generated from the code, so they cannot drift from it.

`<!-- generated: troubleshooting -->` in a page becomes one section per doctor signature
(bootstrap/signatures): what the user sees (a sample log line, from signatures/samples.py),
the cause, the fix, and where the message comes from. `<!-- generated: inventory -->` becomes the
inventory reference (bootstrap/inventory/reference.py: every key, what it takes, its default, what
it does, from the validators and the dataclasses the inventory is read into); `<!-- generated: rack -->`
the checks of `up`'s rack preflight (bootstrap/cluster/rack.py CHECKS); `<!-- generated: fence -->` what
the fence admits and closes, with the bound on `cluster.fence_allow` (bootstrap/cluster/guard/fencedoc.py);
`<!-- generated: secrets -->` what each kind of container holds of the secrets
(bootstrap/cluster/guard/secretstore.py KINDS);
`<!-- generated: cli -->` the CLI reference, from the click commands themselves, in the sections and
order of `bootstrap --help`, with the exit codes (bootstrap/cli/reference.py).

The package map of docs/architecture.md (every module of bootstrap/ with the first sentence of its
docstring) stands in the page itself, between `<!-- generated: package-map -->` and
`<!-- end generated: package-map -->`, so that the page reads whole on GitHub too; the site is built
with it made afresh, `python3 docs/hooks.py` writes it into the page, and tests/docs/test_package_map.py
fails when the page's copy is stale.
"""
from __future__ import annotations

import ast
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the checkout this site is built from, before any installed copy of the package
sys.path.insert(0, str(ROOT))

MARK_TROUBLE = "<!-- generated: troubleshooting -->"
MARK_INVENTORY = "<!-- generated: inventory -->"
MARK_RACK = "<!-- generated: rack -->"
MARK_FENCE = "<!-- generated: fence -->"
MARK_SECRETS = "<!-- generated: secrets -->"
MARK_CLI = "<!-- generated: cli -->"
MARK_MAP = "<!-- generated: package-map -->"
MARK_MAP_END = "<!-- end generated: package-map -->"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
#: The package map's columns: where the sentences start, and how wide a line may be.
MAP_COLUMN, MAP_WIDTH = 30, 112


def troubleshooting() -> str:
    from bootstrap.signatures import SIGNATURES
    from bootstrap.signatures.samples import SAMPLES

    out = []
    for sig in SIGNATURES:
        sample = SAMPLES[sig.id][0]
        out += [f"### {sig.title}", "",
                f"`{sig.id}`, {sig.severity}{' (when InfiniBand is configured)' if sig.requires else ''}. "
                "What you see, in a log `bootstrap logs` shows and as the evidence of `bootstrap doctor`:", "",
                "```text", sample, "```", "",
                f"**Fix.** {sig.fix}", ""]
        links = [s for s in sig.sources if s.startswith("https://")]
        if links:
            out += ["Seen in: " + ", ".join(f"<{u}>" for u in links), ""]
    return "\n".join(out)


def summary(path: Path) -> str:
    """What a module is for: the first sentence of its docstring's first paragraph, on one line, in
    plain text (no backquotes: the map is a text block). ValueError for a module without one."""
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path)), clean=True) or ""
    para = " ".join(doc.split("\n\n")[0].split())
    if not para:
        raise ValueError(f"{path.relative_to(path.parents[len(path.parts) - 2])}: no docstring first line: "
                         "say in one sentence what the module is for")
    m = re.match(r"(.+?[.!?])(?=\s|$)", para)
    return (m.group(1) if m else para).replace("`", "")


def map_entries(pkg: Path) -> list[tuple[int, str, Path]]:
    """(depth, name as the map shows it, the file it is read from) for each module under pkg, a package
    as its folder (read from its __init__.py) ahead of what it holds, each folder's entries by name."""
    out = [(0, pkg.name + "/", pkg / "__init__.py")]

    def walk(folder: Path, depth: int) -> None:
        for p in sorted(folder.iterdir(), key=lambda p: p.name):
            if p.is_dir() and (p / "__init__.py").exists():
                out.append((depth, p.name + "/", p / "__init__.py"))
                walk(p, depth + 1)
            elif p.suffix == ".py" and p.name != "__init__.py":
                out.append((depth, p.name, p))

    walk(pkg, 1)
    return out


def package_map(pkg: Path = ROOT / "bootstrap") -> str:
    """The package map: a text block, one entry per module, its name indented by depth beside its summary."""
    lines = ["```text"]
    for depth, name, path in map_entries(pkg):
        head = "  " * depth + name
        head = f"{head:<{MAP_COLUMN}}" if len(head) < MAP_COLUMN else head + "  "
        lines += textwrap.wrap(summary(path), MAP_WIDTH, initial_indent=head, subsequent_indent=" " * MAP_COLUMN,
                               break_on_hyphens=False)
    return "\n".join([*lines, "```"])


def with_package_map(page: str, pkg: Path = ROOT / "bootstrap") -> str:
    """The page with the package map made afresh between its markers."""
    start, end = page.index(MARK_MAP) + len(MARK_MAP), page.index(MARK_MAP_END)
    return page[:start] + "\n" + package_map(pkg) + "\n" + page[end:]


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARK_MAP in markdown:
        markdown = with_package_map(markdown)
    if MARK_TROUBLE in markdown:
        markdown = markdown.replace(MARK_TROUBLE, troubleshooting())
    if MARK_RACK in markdown:
        from bootstrap.cluster.preflight.checks import CHECKS
        markdown = markdown.replace(MARK_RACK, "\n".join(f"- `{k}`: {v}" for k, v in CHECKS.items()))
    if MARK_FENCE in markdown:
        from bootstrap.cluster.guard.fencedoc import markdown as fence_reference
        markdown = markdown.replace(MARK_FENCE, fence_reference())
    if MARK_SECRETS in markdown:
        from bootstrap.cluster.guard.secretstore import markdown as secrets_reference
        markdown = markdown.replace(MARK_SECRETS, secrets_reference())
    if MARK_CLI in markdown:
        from bootstrap.cli.reference import markdown as cli_reference
        markdown = markdown.replace(MARK_CLI, cli_reference())
    if MARK_INVENTORY in markdown:
        from bootstrap.inventory.reference import markdown as inventory_reference
        markdown = markdown.replace(MARK_INVENTORY, inventory_reference())
    return markdown


if __name__ == "__main__":  # python3 docs/hooks.py: the package map of docs/architecture.md written afresh
    ARCHITECTURE.write_text(with_package_map(ARCHITECTURE.read_text()))
