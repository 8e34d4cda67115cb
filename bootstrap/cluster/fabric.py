"""The fabric's drivers as the kernel shows them, pure: which RDMA devices are AWS EFA, and whether GPUDirect
RDMA can work (issue 64).

- **EFA** (AWS's Elastic Fabric Adapter) shows under /sys/class/infiniband like an HCA (`rdmap16s27`), its
  ports' link_layer "Unknown" (the kernel's word for IB_LINK_LAYER_UNSPECIFIED), its PCI driver `efa`.
  NCCL's own IB transport cannot use it: only NCCL's EFA plugin (aws-ofi-nccl over libfabric) can, and the
  vllm/vllm-openai image ships none, so NCCL falls back to TCP sockets there.
- **GPUDirect RDMA** lets the HCA read and write GPU memory: through the nvidia-peermem module (nv_peer_mem
  before it), or DMA-BUF, which needs NVIDIA's open kernel module and Linux 5.12 or newer
  (docs.nvidia.com GPUDirect RDMA, "Using DMA-BUF"). Without either NCCL stages each transfer through host
  memory: the fabric's bandwidth lost, and FlashInfer's autotune has been seen to deadlock (vllm#52291).

The rack facts script (facts._SCRIPT) prints what these parsers read: `hca NAME DRIVER` per RDMA device, and
a `== gdr` section (the peer-memory modules loaded, /proc/driver/nvidia/version's first line, `uname -r`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

EFA_DRIVER = "efa"

#: What the facts script prints (facts._SCRIPT's `== ib` and `== gdr` sections).
HCA_LINES = r"""
for d in /sys/class/infiniband/*; do
  [ -e "$d" ] || continue
  drv=$(readlink "$d/device/driver" 2>/dev/null); echo "hca ${d##*/} ${drv##*/}"
done
"""
GDR_LINES = r"""
echo "== gdr"
for m in nvidia_peermem nv_peer_mem; do [ -d "/sys/module/$m" ] && echo "module $m"; done
[ -r /proc/driver/nvidia/version ] && echo "driver $(head -n 1 /proc/driver/nvidia/version)"
echo "kernel $(uname -r 2>/dev/null)"
"""


def parse_hca_lines(lines: Sequence[str]) -> dict[str, str]:
    """HCA -> its PCI driver ("mlx5_core", "efa"; "" where the link was not read), from `hca NAME DRIVER` lines."""
    out = {}
    for ln in lines:
        parts = ln.split()
        if len(parts) >= 2 and parts[0] == "hca":
            out[parts[1]] = parts[2] if len(parts) > 2 else ""
    return out


def is_efa(driver: str | None) -> bool:
    """An EFA device: its PCI driver says so (a link layer "Unknown" alone does not)."""
    return driver == EFA_DRIVER


@dataclass(frozen=True)
class GpuDirect:
    """What GPUDirect RDMA could use on a host."""

    #: the peer-memory modules loaded (nvidia_peermem, nv_peer_mem)
    modules: tuple[str, ...] = ()
    #: /proc/driver/nvidia/version's first line ("" where the NVIDIA driver is not loaded or not readable)
    driver: str = ""
    #: `uname -r`
    kernel: str = ""

    @property
    def known(self) -> bool:
        """The NVIDIA driver is loaded and said which: only then is "neither" a finding."""
        return bool(self.driver)

    @property
    def open_module(self) -> bool:
        return "Open Kernel Module" in self.driver

    @property
    def dmabuf(self) -> bool:
        """DMA-BUF is possible: the open kernel module on Linux 5.12 or newer."""
        m = re.match(r"(\d+)\.(\d+)", self.kernel)
        return self.open_module and m is not None and (int(m[1]), int(m[2])) >= (5, 12)

    @property
    def usable(self) -> bool:
        return bool(self.modules) or self.dmabuf

    def describe(self) -> str:
        if self.modules:
            return f"GPUDirect RDMA through {', '.join(self.modules)}"
        if self.dmabuf:
            return "GPUDirect RDMA through DMA-BUF (the open kernel module, Linux " + self.kernel + ")"
        flavour = "the open kernel module" if self.open_module else "the proprietary kernel module"
        return f"no GPUDirect RDMA: nvidia-peermem is not loaded and {flavour} on Linux {self.kernel or '?'} " \
               "offers no DMA-BUF"


def parse_gdr(lines: Sequence[str]) -> GpuDirect | None:
    """The `== gdr` section; None when the section is absent (an older script, or not read)."""
    if not lines:
        return None
    modules, driver, kernel = [], "", ""
    for ln in lines:
        word, _, rest = ln.partition(" ")
        if word == "module" and rest.strip():
            modules.append(rest.strip())
        elif word == "driver":
            driver = rest.strip()
        elif word == "kernel":
            kernel = rest.strip()
    return GpuDirect(tuple(modules), driver, kernel)
