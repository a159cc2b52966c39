"""The work a mutant must survive: per op, the cases the generic suite's CI profile runs (the pinned
regressions, the stratified cases, then ten cases hypothesis draws per dtype, derandomized as the
``ci`` profile draws them) and the op's float64 checks."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, given, settings

from oracle.cases import FLOAT_DTYPES, Case
from oracle.declare.spec import OpSpec

DRAWN_PER_DTYPE = 10  # the ci profile's max_examples (oracle/pytest_plugin.py PROFILES)


@dataclass(frozen=True)
class Item:
    kind: str  # "case": the differential verdict; "float64": the float64 gradient check
    op: str
    case: Case

    def label(self) -> str:
        return f"{self.kind} {self.case.summary()}" if self.kind != "case" else self.case.summary()


def drawn(spec: OpSpec, dtype: str, budget, count: int = DRAWN_PER_DTYPE) -> list[Case]:
    """The cases hypothesis draws for one op and dtype, the same on every run."""
    found: list[Case] = []

    @settings(derandomize=True, database=None, max_examples=count, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=spec.cases(budget, (dtype,)))
    def collect(case):
        found.append(case)

    collect()
    return found


def items_of(spec: OpSpec, budget, dtypes: tuple[str, ...] = FLOAT_DTYPES, float64: bool = True) -> list[Item]:
    cases: list[Case] = []
    for dtype in dtypes:
        cases += [c for c in spec.regressions if c.dtype == dtype] + list(spec.stratified(dtype, budget))
        cases += drawn(spec, dtype, budget)
    unique = {c.summary(): c for c in cases}  # a drawn case may repeat a stratified one
    items = [Item("case", spec.name, c) for c in unique.values()]
    if float64:
        items += [Item("float64", spec.name, c) for c in spec.float64_cases]
    return items
