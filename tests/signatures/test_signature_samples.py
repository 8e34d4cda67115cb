"""Every signature, and every pattern in it, against sample log lines: the table below.

A new signature is one entry in its data module (bootstrap/signatures/*.py) and its sample lines
in bootstrap/signatures/samples.py (the documentation's troubleshooting page shows them too); a
signature without samples, or a pattern that none of its samples matches, fails this file.
"""
import pytest

from bootstrap.signatures import MAX_EVIDENCE, SEVERITIES, SIGNATURES, scan_log, signature
from bootstrap.signatures.engine import normalize
from bootstrap.signatures.samples import SAMPLES

CASES = [pytest.param(id, line, id=f"{id}-{n}") for id, lines in SAMPLES.items() for n, line in enumerate(lines)]


def flags(id: str) -> dict[str, bool]:
    """The context a signature needs to apply (`Signature.requires`)."""
    needs = signature(id).requires
    return {needs: True} if needs else {}


def test_every_signature_has_samples():
    ids = [s.id for s in SIGNATURES]
    missing = [i for i in ids if not SAMPLES.get(i)]
    assert not missing, f"signatures without a sample line in SAMPLES: {missing}"
    unknown = sorted(set(SAMPLES) - set(ids))
    assert not unknown, f"samples for signatures that do not exist: {unknown}"


@pytest.mark.parametrize("id, line", CASES)
def test_sample_yields_exactly_its_finding(id, line):
    findings = scan_log("node-a", line, **flags(id))
    assert [f.id for f in findings] == [id]
    (f,) = findings
    assert f.host == "node-a" and f.severity in SEVERITIES and f.title and f.fix
    assert "\n" not in f.evidence and 0 < len(f.evidence) <= MAX_EVIDENCE
    assert f.evidence.strip("…") in " ".join(normalize(line).split())


@pytest.mark.parametrize("sig", SIGNATURES, ids=lambda s: s.id)
def test_every_pattern_matches_a_sample(sig):
    lines = [normalize(line) for line in SAMPLES.get(sig.id, ())]
    for pat in sig.patterns:
        hit = [ln for ln in lines if pat.needle in ln.lower() and pat.regex.search(ln)
               and not (sig.ignore and sig.ignore.search(ln))]
        assert hit, f"{sig.id}: no sample matches pattern {pat.regex.pattern!r}"


@pytest.mark.parametrize("id, line", [c for c in CASES if signature(c.values[0]).requires])
def test_a_signature_needing_context_stays_silent_without_it(id, line):
    assert id not in [f.id for f in scan_log("node-a", line)]
