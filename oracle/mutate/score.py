"""What a mutation run found: each mutant's class, the score, and the survivors as a reader needs
them (where, which bug class, the diff, and why it survived).

Classes, as a kernel author acts on them:
- ``killed``: a case failed (a verdict, an error, a crash, or a timeout, each of which fails the
  suite the author runs);
- ``not reached``: no case ran the mutated statement: a coverage gap, named by the branch conditions
  the statement sits under and the specialisations the cases did launch;
- ``equivalent``: every case that ran it passed with the unmutated kernel's bits exactly: nothing
  any check can see, on these cases;
- ``undetected``: cases ran it and its bits differ, yet every verdict passed: the gap to close. Its
  line says how far from the float64 truth it is beside the unmutated kernel on those cases
  (``precision``): a survivor at most as far is a rewrite as precise as the kernel (a sum in
  another order, a rounding left out), one farther a precision loss the cases did not flag.
With a baseline (--baseline), a survivor of the suite that the gate flags is ``killed`` too, by the
gate (oracle/mutate/gate.py). The score is killed / (all - equivalent)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace

from oracle.kernel_coverage.source import conditions_over
from oracle.mutate.mutants import Mutant, launch_sites
from oracle.mutate.runner import Outcome

KILLED, NOT_REACHED, EQUIVALENT, UNDETECTED = "killed", "not reached", "equivalent", "undetected"
NOT_RUN = "not run"  # left when --time-limit ran out: counted apart, never in the score
SURVIVED = (NOT_REACHED, EQUIVALENT, UNDETECTED)  # what passed the suite's cases: the gate judges these


@dataclass
class Judged:
    mutant: Mutant
    verdict: str
    reached: int  # how many items ran the mutated statement (all items for host code)
    outcome: Outcome | None
    why: str  # killed: the failure; not reached: what would reach it; otherwise what was compared
    gate: Outcome | None = None  # the gate's judgement of a survivor, where a baseline was given
    precision: dict | None = None  # an undetected mutant's error beside the unmutated kernel's (precision())

    @property
    def by_gate(self) -> bool:
        return self.gate is not None and self.gate.status != "pass"

    def to_json(self) -> dict:
        gate = {} if self.gate is None else {"gate": {"status": self.gate.status, "finding": self.gate.message,
                                                      "seconds": round(self.gate.seconds, 3)}}
        return {**self.mutant.to_json(), "class": self.verdict, "reached": self.reached, "why": self.why,
                "killed_by": killed_by(self) if self.verdict == KILLED else None,
                "status": self.outcome.status if self.outcome else None,
                "seconds": round(self.outcome.seconds, 3) if self.outcome else 0.0, **gate,
                **({"precision": self.precision} if self.precision else {})}


def not_reached_why(mutant: Mutant, specialisations: list[str] | None, known: frozenset[str] = frozenset()) -> str:
    """What would reach a mutant no case ran; ``specialisations`` is None for a function no case
    launched or called at all."""
    conditions = conditions_over(mutant.file, mutant.function_line, mutant.line)
    needs = " and ".join(f"`{c}`" for c in conditions) if conditions else "a launch of this code"
    if specialisations is None:  # never launched: say where the host code would launch it
        where = [f"{name} line {line}" + "".join(f" under `{c}`" for c in conditions_over(mutant.file, first, line))
                 for name, first, line in launch_sites(mutant.file, mutant.function, known)]
        return (f"the cases never launched {mutant.function}" +
                (f" (named in {'; '.join(where[:3])})" if where else "") + f"; inside it, {needs}")
    if not specialisations:  # a @triton.jit helper: its callers' launches are listed with them
        return f"reached only under {needs}"
    seen = "; ".join(specialisations[:3]) + (f" (+{len(specialisations) - 3} more)" if len(specialisations) > 3 else "")
    return f"reached only under {needs}; the cases launched {mutant.function} with {seen}"


def judged(mutant: Mutant, reached: list[int], outcome: Outcome | None, baseline: dict, labels: list[str],
           specialisations: list[str] | None, known: frozenset[str] = frozenset(),
           shadowed: tuple[int, int] | None = None) -> Judged:
    if shadowed is not None:  # runner.py, Note [A definition the module does not use]
        return Judged(mutant, NOT_REACHED, 0, None,
                      f"this definition of {mutant.function} is not the one its module uses here: the one at lines "
                      f"{shadowed[0]}-{shadowed[1]} is (a branch taken at import)")
    if not reached:
        return Judged(mutant, NOT_REACHED, 0, None, not_reached_why(mutant, specialisations, known))
    if outcome is None:
        return Judged(mutant, NOT_RUN, len(reached), None, "the run's --time-limit ran out before it started")
    if outcome.status != "pass":
        where = labels[outcome.item] if outcome.item is not None else "before any case"
        return Judged(mutant, KILLED, len(reached), outcome, f"{outcome.status} on {where}: {outcome.message}")
    compared = [i for i in reached if baseline[i]["digest"] is not None]
    differ = [i for i in compared if outcome.digests.get(i) != baseline[i]["digest"]]
    if not differ and compared:
        return Judged(mutant, EQUIVALENT, len(reached), outcome,
                      f"bit-identical to the unmutated kernel on all {len(compared)} case(s) that ran it")
    if not differ:  # only checks that compare no bits ran it (float64's: within 1e-10 of the truth, gradcheck)
        return Judged(mutant, UNDETECTED, len(reached), outcome,
                      f"only {len(reached)} check(s) that compare no bits ran it (float64), and they passed")
    worst = precision(differ, outcome, baseline)
    return Judged(mutant, UNDETECTED, len(reached), outcome,
                  f"its bits differ on {len(differ)} of {len(compared)} case(s) that ran it (first: "
                  f"{labels[differ[0]]}), and every verdict passed" + precision_note(worst, labels), precision=worst)


def precision(differ: list[int], outcome: Outcome, baseline: dict) -> dict | None:
    """Over the cases where a survivor's bits differ: its largest and mean |k - t| per tensor as a
    multiple of the unmutated kernel's, the worst of each with where (None: nothing to compare)."""
    worst: dict = {}
    farther, compared = set(), set()
    for i in differ:
        theirs = baseline[i].get("errors") or {}
        for tensor, (max_abs, mean_abs) in (outcome.errors.get(i) or {}).items():
            if tensor not in theirs:
                continue
            compared.add(i)
            for key, ours, base in (("max", max_abs, theirs[tensor][0]), ("mean", mean_abs, theirs[tensor][1])):
                ratio = ours / base if base > 0 else (1.0 if ours == 0 else math.inf)
                if key == "max" and ratio > 1:
                    farther.add(i)
                if key not in worst or ratio > worst[key]["ratio"]:
                    worst[key] = {"ratio": ratio, "tensor": tensor, "item": i, "error": ours, "unmutated": base}
    # on how many cases its largest error grew: one of many is a sum's order, all of them a loss
    return {**worst, "farther": len(farther), "cases": len(compared)} if worst else None


def _times(ratio: float) -> str:
    """A ratio of errors as a reader compares it: 3.2x, 1x where equal, 1.000002x where just not."""
    return f"{ratio:.7g}x" if ratio != 1 and abs(ratio - 1) < 1e-3 else f"{ratio:.3g}x"


def precision_note(worst: dict | None, labels: list[str]) -> str:
    """What precision() found, as the end of a survivor's line."""
    if worst is None:
        return ""
    big, mean = worst["max"], worst["mean"]
    if big["ratio"] <= 1 and mean["ratio"] <= 1:
        return (f"; no farther from the float64 truth than the unmutated kernel on any of them (largest error "
                f"{_times(big['ratio'])} its, mean {_times(mean['ratio'])})")
    times = ("where the unmutated kernel is exact" if math.isinf(big["ratio"])
             else f"{_times(big['ratio'])} the unmutated kernel's")
    return (f"; its largest error against the float64 truth is {times} ({big['tensor']}, {big['error']:.3g} against "
            f"{big['unmutated']:.3g}, on {labels[big['item']]}), its mean error at most {_times(mean['ratio'])}, "
            f"farther on {worst['farther']} of those {worst['cases']} case(s)")


def gated(result: Judged, outcome: Outcome | None, labels: dict[int, str]) -> Judged:
    """A survivor of the suite after the gate: killed where it found a regression (a crash or a
    time limit in the report's tasks fails the gate too), else as it was, saying what the gate ran."""
    if result.verdict not in SURVIVED or outcome is None:
        return result
    if outcome.status == "pass":
        return replace(result, gate=outcome, why=f"{result.why}; the gate passed it")
    where = labels.get(outcome.item, "before any task") if outcome.item is not None else "before any task"
    found = outcome.message if outcome.status == "fail" else f"{outcome.status}: {outcome.message}"
    return replace(result, verdict=KILLED, gate=outcome, why=f"killed by the gate on {where}: {found}")


def killed_by(result: Judged) -> str:
    """The check that killed a mutant: the verdict on values, a finding's check (exact, guard-band,
    ...), the float64 check, the gate, or the process itself (an error, a crash, a timeout)."""
    if result.by_gate:
        return "gate"
    if result.outcome.status in ("crash", "timeout"):
        return result.outcome.status
    return "+".join(result.outcome.checks) or result.outcome.status


def catches(results: list[Judged]) -> dict[str, dict[str, int]]:
    """Per check, the operators of the mutants it killed and how many."""
    table: dict[str, Counter] = {}
    for r in results:
        if r.verdict == KILLED:
            for check in killed_by(r).split("+"):
                table.setdefault(check, Counter())[r.mutant.operator] += 1
    return {check: dict(counter) for check, counter in sorted(table.items())}


def score(results: list[Judged]) -> float | None:
    counted = [r for r in results if r.verdict not in (EQUIVALENT, NOT_RUN)]
    return sum(r.verdict == KILLED for r in counted) / len(counted) if counted else None


def report_lines(results: list[Judged], title: str, gate: dict | None = None) -> list[str]:
    counts = Counter(r.verdict for r in results)
    value = score(results)
    lines = [f"mutation score ({title}): " + (f"{value:.1%}" if value is not None else "n/a") +
             f" - {counts[KILLED]} killed of {len(results) - counts[EQUIVALENT] - counts[NOT_RUN]} non-equivalent "
             f"mutants ({len(results)} in all" + (f", {counts[NOT_RUN]} not run: --time-limit" if counts[NOT_RUN] else "")
             + ")"]
    how = Counter(killed_by(r) for r in results if r.verdict == KILLED)
    lines.append(f"  killed {counts[KILLED]} (" + ", ".join(f"{n} by {k}" for k, n in sorted(how.items())) + ")")
    lines.append(f"  equivalent {counts[EQUIVALENT]}, not reached {counts[NOT_REACHED]}, "
                 f"reached but undetected {counts[UNDETECTED]}")
    if gate is not None:
        lines.append(f"  the gate ({gate['tasks']} task(s) of the {gate['grid']} grid against {gate['baseline']}): "
                     f"judged {gate['judged']} survivor(s) of the suite, killed {gate['killed']}")
    by_operator = Counter((r.mutant.operator, r.verdict == KILLED) for r in results
                          if r.verdict not in (EQUIVALENT, NOT_RUN))
    operators = sorted({r.mutant.operator for r in results})
    lines.append("  per operator (killed/non-equivalent): " + ", ".join(
        f"{op} {by_operator[(op, True)]}/{by_operator[(op, True)] + by_operator[(op, False)]}" for op in operators))
    survivors = [r for r in results if r.verdict in (NOT_REACHED, UNDETECTED, EQUIVALENT)]
    if survivors:
        lines.append("survivors:")
    for r in sorted(survivors, key=lambda r: (r.verdict, r.mutant.file, r.mutant.line)):
        m = r.mutant
        lines.append(f"  [{r.verdict}] {m.file}:{m.line} in {m.function}: {m.operator}: {r.why}")
        lines += ["      " + line for line in m.diff().splitlines() if line[:1] in "+-" and line[:3] not in ("---", "+++")]
    return lines
