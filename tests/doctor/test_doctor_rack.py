"""doctor runs `up`'s rack preflight on demand: each finding an error `rack-<check>`, except what its
own cross-node checks already report (drivers, clocks, *_SOCKET_IFNAME)."""
from bootstrap.cluster import facts as F
from bootstrap.cluster.facts import GPU, HostFacts
from bootstrap.cluster.preflight import checks as CK
from bootstrap.doctor.run import _rack_findings
from tests.cluster.test_rack import output
from tests.support.plan_fixtures import gpu_inventory


def test_doctor_reports_the_rack_checks_it_does_not_already_have():
    inv = gpu_inventory()
    a, b = inv.hosts
    facts = {a.name: HostFacts("26.1", gpus=(GPU("H100", 81559, "580.159.04"),), nofile_hard=4096,
                               rack=F.parse_rack(output(ip=a.ip))),
             b.name: HostFacts("26.1", gpus=(GPU("H100", 81559, "570.86.15"),), nofile_hard=1048576,
                               rack=F.parse_rack(output(ip=b.ip).replace("ens5", "ens6")))}
    found = _rack_findings(inv, facts, inv.hosts)
    assert [(f.id, f.host, f.severity) for f in found] == [("rack-nofile", a.name, "error")]
    assert found[0].title == CK.CHECKS["nofile"] and "4096" in found[0].evidence
