"""perf/pd_bind.py's pure parts: the two inventories, the table, the means and the text check."""
import yaml

from perf import pd_bind as B


def test_the_bound_inventory_asks_for_vllms_binding_and_the_plan_one_leaves_it_to_the_plan(tmp_path):
    src = tmp_path / "inventory.yaml"
    src.write_text(yaml.safe_dump({"cluster": {"name": "sandbox"}, "hosts": [
        {"name": f"node{i}", "address": f"10.0.0.{i}", "env": {"X": "1", B.BIND: "0"}} for i in (1, 2, 3)]}))
    bound = yaml.safe_load(open(B.pd_inventory(src, "bound", tmp_path)))
    plan = yaml.safe_load(open(B.pd_inventory(src, "plan", tmp_path)))
    for doc in (bound, plan):
        assert [h["name"] for h in doc["hosts"]] == ["node1", "node2"]
        assert doc["cluster"]["replicas"] == 2 and doc["cluster"]["router"]["prefill"] == [0]
    assert [h["env"] for h in bound["hosts"]] == [{"X": "1", B.BIND: "auto"}] * 2
    assert [h["env"] for h in plan["hosts"]] == [{"X": "1"}] * 2


def test_table_means_and_texts():
    a = B.Round("bound", 1, [5.0, 9.0, 48.0], ["x", "y", "z"], "vLLM's binding")
    b = B.Round("plan", 1, [1.0, 3.0, 120.0], ["x", "y", None], "unbound by the plan")
    c = B.Round("plan", 2, error="serve: replica 1 did not serve")
    rows = B.table([a, b, c])
    assert rows[1].split() == ["bound", "1", "3/3", "20.67", "9.00", "48.00", "vLLM's", "binding"]
    assert rows[2].split()[:6] == ["plan", "1", "2/3", "2.00", "2.00", "3.00"]  # the failed request left out
    assert rows[3].endswith("error: serve: replica 1 did not serve")
    assert B.mean_of([a, b, c], "plan") == 2.0 and B.mean_of([c], "plan") is None
    assert b.failed == 1 and B.same_texts([a, b])
    assert not B.same_texts([a, B.Round("plan", 1, [1.0], ["other"])])
