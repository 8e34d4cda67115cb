"""A host's CPU architecture against the cluster image's (issue 64): `uname -m` read by the rack facts, the
image's platform from `docker image inspect` (recorded from real hosts: tests/data/hosts/images), the checks
`arch` and `image-arch`, `--load-image` of this machine's image refused before it is sent, and a pull that
finds no build for the host's platform explained. The sandbox loads an image of another architecture on a
node (tests/sandbox/test_sandbox_infra.py)."""
import json
from pathlib import Path

import pytest

from bootstrap.cluster import facts as F
from bootstrap.cluster.imagedist import run as IR
from bootstrap.cluster.preflight import checks as CK
from bootstrap.cluster.preflight import registry as PR
from bootstrap.containers import image_platform
from bootstrap.errors import CommandFailed, PreflightFailed

IMAGES = Path(__file__).resolve().parents[1] / "data" / "hosts" / "images"


def rack(machine):
    return F.parse_rack(f"== addr\n2: eth0    inet 10.0.0.1/24 scope global eth0\n== arch\n{machine}\n")


@pytest.mark.parametrize("machine,arch", [("x86_64", "amd64"), ("aarch64", "arm64"), ("ppc64le", "ppc64le"),
                                          ("sparc64", "sparc64")])
def test_uname_m_is_named_as_image_platforms_name_it(machine, arch):
    f = rack(machine)
    assert (f.machine, f.arch) == (machine, arch)
    assert F.parse_rack("== clock\n1\n").arch is None
    assert "uname -m" in F.RACK_FACTS[2]


def test_the_platform_of_images_inspected_on_real_hosts():
    for name in ("classic-20.10-pulled.json", "containerd-26.1-pulled.json",
                 "containerd-26.1-loaded-from-classic.json"):
        doc = json.loads((IMAGES / name).read_text())
        obj = doc[0] if isinstance(doc, list) else doc
        assert image_platform(obj) == "linux/amd64", name
        assert F.parse_image_platform(json.dumps(obj)) == "linux/amd64", name
    assert image_platform({"Os": "linux", "Architecture": "arm64", "Variant": "v8"}) == "linux/arm64/v8"
    assert F.platform_arch("linux/arm64/v8") == "arm64" and F.platform_arch(None) is None
    # the container's object (with a State) is not the image
    assert F.parse_image_platform(json.dumps({"State": {}, "Architecture": "amd64"})) is None


def nodes(*specs):
    return [PR.RackNode(name, "10.0.0.1", rack(machine), image_platform=platform) for name, machine, platform in specs]


def test_an_image_of_another_architecture_on_a_node_and_a_rack_of_two_architectures_are_refused():
    ok = CK.check_rack(nodes(("a", "x86_64", "linux/amd64"), ("b", "x86_64", None)))
    assert [f for f in ok if f.check in ("arch", "image-arch")] == []
    found = CK.check_rack(nodes(("a", "x86_64", "linux/amd64"), ("b", "aarch64", "linux/amd64"),
                                ("c", "x86_64", None)))
    arch = {(f.check, f.host): f for f in found if f.check in ("arch", "image-arch")}
    assert set(arch) == {("arch", "b"), ("image-arch", "b")}, arch
    assert arch["arch", "b"].what == "CPU architecture: arm64, the other nodes amd64"
    assert arch["image-arch", "b"].what.startswith("the cluster image on it is built for linux/amd64, the host is "
                                                   "arm64 (aarch64)")
    assert "linux/arm64" in arch["image-arch", "b"].fix and "up --pull" in arch["image-arch", "b"].fix
    assert "arch" in CK.CHECKS and "image-arch" in CK.CHECKS


def test_load_image_of_another_architecture_is_refused_before_anything_is_sent(monkeypatch):
    from bootstrap.remote import localdocker as LD

    monkeypatch.setattr(LD, "image_platform", lambda ref: "linux/amd64")
    facts = {"gh200-1": F.HostFacts("28.1.1", rack=rack("aarch64")), "x86": F.HostFacts("28.1.1", rack=rack("x86_64"))}
    with pytest.raises(PreflightFailed) as err:
        IR._same_arch(facts, "vllm/vllm-openai:v0.32.0")
    assert err.value.host == "gh200-1"
    assert "this machine's vllm/vllm-openai:v0.32.0 is built for linux/amd64, gh200-1 is arm64 (aarch64)" in \
        err.value.reason and "exec format error" in err.value.reason
    assert "docker pull --platform linux/arm64 vllm/vllm-openai:v0.32.0" in err.value.hint
    IR._same_arch({"x86": facts["x86"]}, "vllm/vllm-openai:v0.32.0")  # the same architecture: nothing to say


def test_a_pull_without_a_build_for_the_hosts_platform_says_so():
    class Host:
        name = "gh200-1"

        class settings:
            command_timeout = 60

        def run(self, *a, **kw):
            # Docker's own words (moby distribution/pull_v2.go) for an amd64-only image on an arm64 host
            raise CommandFailed("gh200-1", "docker pull", 1, "no matching manifest for linux/arm64/v8 in the manifest "
                                "list entries")
    with pytest.raises(CommandFailed) as err:
        IR.pull_image(Host(), "vllm/vllm-openai:v0.32.0")
    assert "no build for this host's CPU architecture" in err.value.hint
