"""The verdict of a benchmark run: each stated target met, missed, or not measured, one line each.

A target is reported as met (or missed) only when the run measured the quantity and compared it
with the target; one the run could not measure (a single N, so no scaling ratio; a tool not
installed; every run at some N failed) is printed as "not measured" with the reason, and never
counted as met. Pure: the benchmarks build their `Check`s from what they measured and print
`lines(...)`; the exit status is 1 when a target is missed or a run failed (`exit_status`), and a
target not measured leaves it as it is.

    target met: exec(64)/pssh(64) <= 1 (measured 0.50)
    target missed: exec(64)/exec(1) <= 3 (measured 4.12)
    target not measured: exec(Nmax)/exec(1) <= 3 (one N only: --nodes 64)
    verdict: 1 met, 1 missed, 1 not measured (of 3 targets)
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Iterable, Sequence

OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt}
NEGATED = {"<=": ">", "<": ">=", ">=": "<", ">": "<="}


@dataclass(frozen=True)
class Check:
    """One stated target: `name op limit` (e.g. "up(8)/up(1) <= 1.3"), and what the run measured.

    value None: not measured, and `why` says why. `spec` formats the value and, when it is a
    percentage (".0%"), the limit too; `unit` follows both ("s")."""

    name: str
    op: str
    limit: float
    value: float | None = None
    why: str = ""
    unit: str = ""
    spec: str = ".2f"

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"{self.op!r}: not one of {', '.join(OPS)}")
        if self.value is None and not self.why:
            raise ValueError(f"{self.name}: a target not measured needs the reason why")

    @property
    def measured(self) -> bool:
        return self.value is not None and math.isfinite(self.value)

    @property
    def passed(self) -> bool | None:
        """True: met; False: missed; None: not measured."""
        return OPS[self.op](self.value, self.limit) if self.measured else None

    def _show(self, x: float, spec: str) -> str:
        return f"{format(x, spec)}{self.unit}"

    @property
    def target(self) -> str:
        return f"{self.name} {self.op} {self._show(self.limit, self.spec if self.spec.endswith('%') else 'g')}"

    @property
    def shown(self) -> str:
        """The measured value as printed ("-" when not measured)."""
        return self._show(self.value, self.spec) if self.measured else "-"

    @property
    def shortfall(self) -> str:
        """A missed target as one phrase: "up(8)/up(1) = 1.40 > 1.3"."""
        limit = self._show(self.limit, self.spec if self.spec.endswith("%") else "g")
        return f"{self.name} = {self.shown} {NEGATED[self.op]} {limit}"

    def line(self) -> str:
        if not self.measured:
            why = self.why or f"the measured value is {self.value}"
            return f"target not measured: {self.target} ({why})"
        return f"target {'met' if self.passed else 'missed'}: {self.target} (measured {self.shown})"


def not_measured(name: str, op: str, limit: float, why: str, **kw) -> Check:
    return Check(name, op, limit, None, why, **kw)


def no_ratio_to_one(nodes: Sequence[int]) -> str | None:
    """Why these --nodes give no ratio against N=1 (one N only, or no N=1 among them); None when
    they do. The reason a scaling target is printed as not measured."""
    if len(nodes) == 1:
        return f"one N only: --nodes {nodes[0]}"
    if nodes[0] != 1:
        return f"no N=1 in --nodes {','.join(str(n) for n in nodes)}"
    return None


def lines(checks: Sequence[Check], failures: Iterable[str] = ()) -> list[str]:
    """What a run prints at the end: the runs that failed, one line per target, and a count."""
    out = [f"run failed: {f}" for f in failures]
    out += [c.line() for c in checks]
    met = sum(c.passed is True for c in checks)
    missed = sum(c.passed is False for c in checks)
    out.append(f"verdict: {met} met, {missed} missed, {len(checks) - met - missed} not measured "
               f"(of {len(checks)} target{'s' if len(checks) != 1 else ''})")
    return out


def exit_status(checks: Sequence[Check], failures: Iterable[str] = ()) -> int:
    """1 when a target is missed or a run failed; a target not measured does not change it."""
    return 1 if list(failures) or any(c.passed is False for c in checks) else 0
