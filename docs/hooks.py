"""mkdocs hook: the pages generated from the code, so they cannot drift from it.

`<!-- generated: troubleshooting -->` in a page becomes one section per doctor signature
(bootstrap/signatures): what the user sees (a sample log line, from signatures/samples.py),
the cause, the fix, and where the message comes from. `<!-- generated: inventory -->` becomes the
inventory reference (bootstrap/inventory/reference.py: every key, what it takes, its default, what
it does, from the validators and the dataclasses the inventory is read into); `<!-- generated: rack -->`
the checks of `up`'s rack preflight (bootstrap/cluster/rack.py CHECKS); `<!-- generated: fence -->` what
the fence admits and closes, with the bound on `cluster.fence_allow` (bootstrap/cluster/guard/fencedoc.py);
`<!-- generated: secrets -->` what each kind of container holds of the secrets (bootstrap/cluster/guard/secretstore.py KINDS);
`<!-- generated: cli -->` the CLI reference, from the click commands themselves, in the sections and
order of `bootstrap --help`, with the exit codes (bootstrap/cli/reference.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

# the checkout this site is built from, before any installed copy of the package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MARK_TROUBLE = "<!-- generated: troubleshooting -->"
MARK_INVENTORY = "<!-- generated: inventory -->"
MARK_RACK = "<!-- generated: rack -->"
MARK_FENCE = "<!-- generated: fence -->"
MARK_SECRETS = "<!-- generated: secrets -->"
MARK_CLI = "<!-- generated: cli -->"


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


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARK_TROUBLE in markdown:
        markdown = markdown.replace(MARK_TROUBLE, troubleshooting())
    if MARK_RACK in markdown:
        from bootstrap.cluster.rack import CHECKS
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
