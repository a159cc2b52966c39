"""The gate where a baseline is given (``python -m oracle.mutate --baseline PATH``).

Note [The gate judges the survivors]
    A user who gates CI on a stored report run (``python -m oracle.report --gate``) has a second
    check beside the suite: a mutant every suite case passes may still regress against that
    baseline (its typical error grown past the room a valid evaluation has, a new finding). So each
    survivor of the suite (not reached, equivalent or undetected) is judged as ``python -m
    oracle.report --gate --ops OP`` judges a run: the report's tasks for the run's ops on the
    baseline's grid (sweep.plan), their answers made into the report's document (results.build)
    and compared with the baseline (gate.compare). A regression kills the mutant.

    Only survivors pay. When the first survivor needs it, the unmutated implementation runs the
    grid once (split over the workers), recording which kernel lines each task ran; it must pass
    the gate itself, else the baseline is not this implementation's and every mutant would fail it
    (exit 2). A survivor then runs only the tasks whose unmutated run executed its statement (every
    task of its ops for host code, and on a GPU, where no lines are traced), cheapest first. Its
    document is the unmutated one with those tasks' answers replaced; it is compared again after
    each answer that differs from the unmutated one (an unchanged document is the unmutated one,
    which passed), so that the first regression stops it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from oracle.errors import BaselineError
from oracle.mutate.mutants import Mutant
from oracle.mutate.runner import Outcome, installed
from oracle.report import gate as report_gate
from oracle.report import results, sweep


@dataclass(frozen=True)
class Plan:
    """The stored baseline and the report's tasks that are compared with it."""

    path: str
    baseline: dict
    tasks: list[sweep.Task]
    grid: str  # the baseline's: sweep.grid_name
    selection: report_gate.Selection

    def summary(self) -> str:
        return f"{len(self.tasks)} task(s) of the report's {self.grid} grid, against {self.path}"


def plan(path: str, ops: list[str], platform: str, noise_model: str) -> Plan:
    """The gate's plan for ``ops``; raises BaselineError, before any mutant runs, for a missing,
    unreadable, malformed or foreign baseline, one holding no cell of an op, or one whose cells
    the report's grid no longer makes (as ``python -m oracle.report --gate --ops`` refuses them)."""
    baseline = report_gate.load_baseline(Path(path), platform, noise_model)
    held = {cell["op"] for cell in baseline["cells"]}
    lacking = [op for op in ops if op not in held]
    if lacking:
        raise BaselineError(f"the baseline {path} holds no cell of {', '.join(lacking)} (its ops: "
                            f"{', '.join(sorted(held))}), so the gate could judge none of its mutants; make one "
                            "with python -m oracle.report --ops ... --update-baseline --baseline PATH")
    grid = str(baseline.get("sweep"))
    checked = any(check["op"] in ops for check in baseline["aliasing"])  # the report's default; --no-checks omits
    tasks = sweep.plan(grid.startswith("full"), ops, checks=checked, at_scale=grid.endswith("+scale"))
    selection = report_gate.Selection(ops=tuple(ops))
    keys = results.cell_keys(tasks)
    report_gate.check_overlap(keys, baseline, Path(path))
    problem = report_gate.coverage_problem(keys, set(ops), baseline, selection, grid, None, Path(path))
    if problem:
        raise BaselineError(problem)
    return Plan(path, baseline, tasks, grid, selection)


def regression(plan: Plan, answers: dict[int, dict], environment: dict, impl: str) -> str | None:
    """The gate's first regression for the tasks' ``answers``, or what it could not judge; None when
    it passes (oracle/report/__main__.py's _gate_status, from the same comparison)."""
    document = results.build(plan.tasks, answers, impl, plan.grid, environment, 0.0)
    comparison = report_gate.compare(document, plan.baseline, plan.selection)
    if comparison["regressions"]:
        return comparison["regressions"][0]
    if not comparison["judged"]:
        return f"no cell of this run could be judged against the baseline {plan.path}"
    unasked = report_gate.unasked(comparison)
    return f"the gate never passes what it did not judge: {'; '.join(unasked)}" if unasked else None


# --- in the child ----------------------------------------------------------------------------------

def answer(task: sweep.Task, impl, device) -> dict:
    """A task's answer as the report's worker gives it (oracle/report/worker.py), through JSON as
    the worker's travels, so that the document is the one the report would build."""
    from oracle.cases import Case
    from oracle.checks import aliasing
    from oracle.declare.registry import SPECS
    from oracle.engine import run_case

    case = Case(**json.loads(task.message())["case"])
    if task.kind == "case":
        reply = {"id": task.id, "result": run_case(case.op, case, impl, device).to_dict()}
    else:
        begin = time.perf_counter()
        findings = aliasing.run_check(task.check, SPECS[case.op], case, impl, device)
        reply = {"id": task.id, "findings": [asdict(finding) for finding in findings],
                 "seconds": time.perf_counter() - begin}
    return json.loads(json.dumps(reply, default=str))


def reference_work(tasks: list[sweep.Task], chosen: list[int], impl: str, device, started) -> dict:
    """The unmutated implementation on the ``chosen`` tasks: per task its answer, the (kernel, line)
    pairs it ran and its time; and the run's environment, as the report records it."""
    from oracle.declare.implementations import load
    from oracle.environment import environment
    from oracle.kernel_coverage import capture

    loaded = load(impl)
    answers, lines, seconds = {}, {}, {}
    for index in chosen:
        started(index)
        begin = time.perf_counter()
        with capture() as ran:
            answers[index] = answer(tasks[index], loaded, device)
        lines[index], seconds[index] = sorted(ran), time.perf_counter() - begin
    return {"answers": answers, "lines": lines, "seconds": seconds, "environment": environment()}


def mutant_work(mutant: Mutant, plan: Plan, order: list[int], reference: dict[int, dict], environment: dict,
                impl: str, scratch: str, device, started) -> Outcome:
    """The mutant on ``order``'s tasks, each answer in place of the unmutated one, until the gate
    finds a regression (Note [The gate judges the survivors])."""
    from oracle.declare.implementations import load

    with installed(mutant, scratch):
        loaded = load(impl)
        answers = dict(reference)
        begin = time.perf_counter()
        for index in order:
            started(index)
            answers[index] = answer(plan.tasks[index], loaded, device)
            if _differs(answers[index], reference[index]):
                found = regression(plan, answers, environment, impl)
                if found is not None:
                    return Outcome("fail", index, found, checks=["gate"], seconds=time.perf_counter() - begin)
        return Outcome("pass", seconds=time.perf_counter() - begin)


def _differs(mine: dict, theirs: dict) -> bool:
    """Whether an answer differs from the unmutated one beyond its timings."""
    def timeless(reply):
        if "result" in reply:
            return {**reply, "result": {k: v for k, v in reply["result"].items() if k != "seconds"}}
        return {k: v for k, v in reply.items() if k != "seconds"}
    return timeless(mine) != timeless(theirs)
