"""The node checks' rules, pure: what NCCL's and Gloo's variables select, and which CUDA an image needs.

Also whether a driver runs an image anyway (NVIDIA_REQUIRE_CUDA's forward-compatibility rule)."""
from __future__ import annotations

import re
from typing import Mapping, Sequence


# -- selections (NCCL's and Gloo's variables) ------------------------------------------------------
def select_interfaces(var: str, value: str, names: Sequence[str]) -> list[str] | None:
    """The interface names `value` selects among `names`; None when the value is not valid syntax for
    `var`. NCCL_SOCKET_IFNAME: comma-separated prefixes; a leading ^ excludes them, a leading =
    matches names exactly. GLOO_SOCKET_IFNAME: comma-separated exact names. TP_SOCKET_IFNAME: one
    exact name."""
    spec = value.strip()
    if var == "NCCL_SOCKET_IFNAME":
        exclude = spec.startswith("^")
        spec = spec[1:] if exclude else spec
        exact = spec.startswith("=")
        spec = spec[1:] if exact else spec
        wanted = [n.strip() for n in spec.split(",") if n.strip()]

        def hit(name: str) -> bool:
            return any(name == n if exact else name.startswith(n) for n in wanted)
        return [n for n in names if hit(n) != exclude]
    if spec.startswith(("^", "=")):
        return None
    wanted = [n.strip() for n in spec.split(",") if n.strip()]
    if var == "TP_SOCKET_IFNAME":
        wanted = wanted[:1]
    return [n for n in names if n in wanted]


def ib_hcas(value: str) -> tuple[bool, list[str]]:
    """NCCL_IB_HCA: (exclusive list?, the HCA names it names). `mlx5_0:1,mlx5_1`, `=mlx5_0`,
    `^mlx5_2` (an exclusion: not a list of HCAs the node must have)."""
    spec = value.strip()
    exclude = spec.startswith("^")
    spec = spec.lstrip("^=")
    return exclude, [p.split(":")[0].strip() for p in spec.split(",") if p.split(":")[0].strip()]


# -- CUDA versions --------------------------------------------------------------------------------
def version(text: str | None) -> tuple[int, ...] | None:
    """"12.8.1" -> (12, 8, 1); None when it does not start with a number."""
    m = re.match(r"\s*(\d+(?:\.\d+)*)", text or "")
    return tuple(int(x) for x in m[1].split(".")) if m else None


def image_cuda_need(env: Mapping[str, str]) -> str | None:
    """The CUDA (major.minor) an image is built for: CUDA_VERSION, else NVIDIA_REQUIRE_CUDA's cuda>=X."""
    v = version(env.get("CUDA_VERSION"))
    if v is None:
        m = re.search(r"(?:^|\s)cuda>=(\d+\.\d+)", env.get("NVIDIA_REQUIRE_CUDA", ""))
        v = version(m[1]) if m else None
    return ".".join(map(str, v[:2])) if v else None


def forward_compatible(require: str, driver: str | None) -> bool:
    """Whether NVIDIA_REQUIRE_CUDA lets this driver run the image anyway: its space-separated
    alternatives are ORed, the comma-separated constraints of one ANDed (the NVIDIA Container
    Toolkit's rule), and `brand=...,driver>=535,driver<536` alternatives name the drivers the image's
    CUDA forward-compatibility libraries serve. The GPU brand is not compared (any brand passes)."""
    d = version(driver)
    if d is None:
        return False
    for alt in require.split():
        conds = [c for c in alt.split(",") if c.startswith("driver")]
        if not conds or any(not c.startswith("driver") and not c.startswith("brand=") for c in alt.split(",")):
            continue
        ok = True
        for c in conds:
            m = re.match(r"driver(>=|<=|<|>|=)(\S+)", c)
            want = version(m[2]) if m else None
            if want is None:
                ok = False
                break
            have = d[:len(want)]
            ok = {">=": have >= want, "<=": have <= want, "<": have < want, ">": have > want, "=": have == want}[m[1]]
            if not ok:
                break
        if ok:
            return True
    return False
