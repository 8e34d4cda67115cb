"""perf/shapes.py without a sandbox: each row's inventory and serve options, and bad rows refused."""
import subprocess
import sys

import yaml

from perf import shapes as S

SANDBOX = {"cluster": {"name": "sandbox", "accelerator": "none", "router": {"port": 30000}},
           "hosts": [{"name": f"node{i}", "address": f"172.31.240.1{i}"} for i in range(1, 5)]}


def test_each_row_gets_its_hosts_replicas_and_router(tmp_path):
    src = tmp_path / "inv.yaml"
    src.write_text(yaml.safe_dump(SANDBOX))
    got = {n: yaml.safe_load(open(S.inventory(src, n, tmp_path))) for n in S.SHAPES}
    assert [len(got[n]["hosts"]) for n in S.SHAPES] == [3, 3, 3, 2, 2]
    assert "router" not in got["pp3"]["cluster"] and got["dp3"]["cluster"]["replicas"] == 1
    assert got["replicas3"]["cluster"]["replicas"] == 3 and "prefill" not in got["replicas3"]["cluster"]["router"]
    assert got["pd"]["cluster"]["router"]["prefill"] == [0] and got["pd"]["cluster"]["replicas"] == 2
    assert S.SHAPES["pp3"][3] == ["--tp", "1", "--pp", "3"] and S.SHAPES["dp3"][3] == ["--dp", "3"]


def test_an_unknown_row_is_refused_before_anything_runs():
    r = subprocess.run([sys.executable, "-m", "perf.shapes", "--rows", "pp3,bogus"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "unknown row 'bogus'" in r.stderr
