"""Does every node hold the same model files: the `find` manifest, its parser and the comparison; pure, no I/O.

* `manifest_cmd` / `model_manifest`: {relative path: size} of a model directory.
* `compare_manifests` / `describe`: which hosts differ from the reference, in one line.
* `sync_files` / `stale_files`: what a copy from the head carries and removes (serve/modelsync.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from bootstrap.errors import ServePlanError


def manifest_cmd(directory: str) -> tuple[str, ...]:
    """The command whose output `model_manifest` parses (relative path, tab, size in bytes); a copy
    still being received (serve/modelsync.py) is not part of the model."""
    return ("find", directory, "-name", ".bootstrap-incoming", "-prune", "-o", "-type", "f", "-printf", "%P\\t%s\\n")


def model_manifest(find_output: str) -> dict[str, int]:
    """{relative path: size} from `find DIR -type f -printf '%P\\t%s\\n'`."""
    out: dict[str, int] = {}
    for n, line in enumerate(find_output.splitlines(), 1):
        if not line.strip():
            continue
        path, sep, size = line.rpartition("\t")
        if not sep or not path or not size.strip().isdigit():
            raise ServePlanError(f"manifest line {n} is not 'path<TAB>size': {line[:120]!r}")
        out[path] = int(size)
    return out


@dataclass(frozen=True)
class ManifestDiff:
    host: str
    #: files the reference host has and this one lacks
    missing: tuple[str, ...]
    #: files this host has and the reference lacks
    extra: tuple[str, ...]
    #: (path, size on the reference, size here)
    size_mismatch: tuple[tuple[str, int, int], ...]

    @property
    def incomplete(self) -> bool:
        """Missing or different files (extra files alone do not stop vLLM loading)."""
        return bool(self.missing or self.size_mismatch)


def compare_manifests(manifests: Mapping[str, Mapping[str, int]], reference_host: str) -> list[ManifestDiff]:
    """One ManifestDiff per host whose files differ from the reference host's, in the mapping's
    order; an empty list when every host holds the same files with the same sizes."""
    if reference_host not in manifests:
        raise ServePlanError(f"reference host {reference_host} has no manifest")
    ref = manifests[reference_host]
    diffs = []
    for host, man in manifests.items():
        if host == reference_host:
            continue
        missing = tuple(sorted(set(ref) - set(man)))
        extra = tuple(sorted(set(man) - set(ref)))
        sizes = tuple((p, ref[p], man[p]) for p in sorted(set(ref) & set(man)) if ref[p] != man[p])
        if missing or extra or sizes:
            diffs.append(ManifestDiff(host, missing, extra, sizes))
    return diffs


def sync_files(reference: Mapping[str, int], receivers: Sequence[Mapping[str, int]]) -> tuple[str, ...] | None:
    """The reference's files a copy to these receivers carries: those any of them lacks or holds at
    another size (what compare_manifests calls different), sorted. None: every file (the stream is
    then the whole directory); () when only extra files differ (nothing to send, some to remove)."""
    need = {p for m in receivers for p, size in reference.items() if m.get(p) != size}
    if len(need) == len(reference):
        return None
    return tuple(sorted(need))


def stale_files(reference: Mapping[str, int], receiver: Mapping[str, int]) -> tuple[str, ...]:
    """The receiver's files the reference does not have (removed when the copy is put in place)."""
    return tuple(sorted(set(receiver) - set(reference)))


def _names(paths: Iterable[str], limit: int = 3) -> str:
    paths = list(paths)
    shown = ", ".join(paths[:limit])
    return shown + (", ..." if len(paths) > limit else "")


def describe(diffs: Sequence[ManifestDiff]) -> str:
    """One line: 'node2: 3 files missing (a, b, c), 1 size differs (d); node3: 1 extra file (e)'."""
    if not diffs:
        return "every host has the same model files"
    parts = []
    for d in diffs:
        bits = []
        if d.missing:
            n = len(d.missing)
            bits.append(f"{n} file{'s' if n > 1 else ''} missing ({_names(d.missing)})")
        if d.size_mismatch:
            n = len(d.size_mismatch)
            bits.append(f"{n} size{'s differ' if n > 1 else ' differs'} ({_names(p for p, _, _ in d.size_mismatch)})")
        if d.extra:
            n = len(d.extra)
            bits.append(f"{n} extra file{'s' if n > 1 else ''} ({_names(d.extra)})")
        parts.append(f"{d.host}: {', '.join(bits)}")
    return "; ".join(parts)
