"""The inventory reference (bootstrap/inventory/reference.py) covers every key the inventory reads:
each with what it takes, its default and what it does. A key added to fields.py without a validator
description or a `#:` comment in model.py (or a DESCRIPTIONS entry) fails here."""
import pytest

from bootstrap.inventory import reference as R

KEYS = [(place, key) for place, fields, _ in R.SECTIONS for key in fields]


@pytest.mark.parametrize("place,key", KEYS, ids=lambda x: str(x))
def test_every_key_says_what_it_takes_its_default_and_what_it_does(place, key):
    row = next(r for r in R.rows(place) if r[0] == key)
    _, takes, default, what = row
    assert takes and default and what, row
    assert "None" not in default


def test_the_markdown_has_a_row_for_every_key():
    text = R.markdown()
    for place, fields, _ in R.SECTIONS:
        section = text.split(f"### `{place}`", 1)[1].split("### ", 1)[0]
        assert [ln.split("`")[1] for ln in section.splitlines() if ln.startswith("| `")] == list(fields), place


def test_the_reference_follows_the_code():
    from bootstrap import model as M

    rows = {r[0]: r for r in R.rows("cluster.router")}
    assert rows["port"][2] == f"`{M.Router().port}`"
    assert "`round_robin`" in rows["policy"][1] and "`random`" in rows["policy"][1]
    takes = {r[0]: r[1] for r in R.rows("cluster")}
    assert R.rows("cluster")[0][0] == "name" and takes["mounts"].startswith("a list, each")
