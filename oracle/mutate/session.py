"""One mutation run: the baseline (split over the workers), the mutants of the kernels it launched,
each mutant on the cases that reach it, and the report."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from oracle import kernel_coverage
from oracle.declare.registry import SPECS
from oracle.mutate import gate as mutate_gate
from oracle.mutate import score
from oracle.mutate.cases import items_of
from oracle.mutate.mutants import Mutant, jit_callers, launched_in, mutants_of_kernels
from oracle.mutate.gate import Plan
from oracle.mutate.runner import Outcome, default_workers, run_all

BASELINE_TIMEOUT_S = 1800.0
FORK_AND_IMPORT_S = 30.0  # a child's own start: importing the implementation, compiling on a GPU


def on_lines(mutant: Mutant, lines: tuple[tuple[str | None, int], ...] | None) -> bool:
    """Whether ``lines`` (--lines: file ending or None, line) asks for the line its edit starts on;
    every line where None. A file ending is whole path components: rms_norm.py, kernels/rms_norm.py."""
    if lines is None:
        return True
    parts = Path(mutant.file).parts
    return any(mutant.line == line and (file is None or parts[-len(Path(file).parts):] == Path(file).parts)
               for file, line in lines)


class Session:
    def __init__(self, impl: str, ops: list[str], operators: list[str], workers: int | None, gpu: bool,
                 budget, dtypes: tuple[str, ...], float64: bool = True, op_modules: tuple[str, ...] = (),
                 time_limit: float | None = None, gate: Plan | None = None,
                 lines: tuple[tuple[str | None, int], ...] | None = None) -> None:
        self.impl, self.ops, self.operators, self.gpu, self.op_modules = impl, ops, set(operators), gpu, list(op_modules)
        self.gate = gate  # the stored report run survivors are gated against (--baseline), or None
        self.lines = lines  # --lines: (file ending or None, line) where mutants are made; None: everywhere
        self.gated: dict | None = None  # what the gate did: the JSON's "gate"
        self.device = "cuda" if gpu else "cpu"  # each child picks its own (oracle.engine.devices.default_device)
        self.stop_at = time.monotonic() + time_limit if time_limit else None
        self.workers = workers or default_workers(gpu)
        self.items = [item for op in ops for item in items_of(SPECS[op], budget, dtypes, float64)]
        self.labels = [item.label() for item in self.items]
        self.kills: Counter = Counter()  # item -> mutants it killed: the next mutants try it first
        self.cache: str | None = None  # where the baseline keeps each case's references, during run()
        self.live: dict = {}  # per kernel file, the lines of the definition each name holds (runner.live_definitions)

    def baseline(self) -> tuple[dict, dict]:
        """Per item its answer (status, lines, digest, seconds), and the kernels launched."""
        chunks = [list(range(i, len(self.items), self.workers)) for i in range(min(self.workers, len(self.items)))]
        jobs = [(n, (lambda chunk=chunk: ("baseline", {"items": self.items, "chosen": chunk, "impl": self.impl,
                                                        "op_modules": self.op_modules, "cache": self.cache})),
                 BASELINE_TIMEOUT_S)
                for n, chunk in enumerate(chunks)]
        answers = run_all(jobs, self.workers, self.gpu)
        items, kernels = {}, {}
        self.live = {}
        for n, answer in answers.items():
            if isinstance(answer, Outcome):  # the unmutated implementation crashed or raised
                where = self.labels[answer.item] if answer.item is not None else "loading it"
                raise RuntimeError(f"the unmutated {self.impl} {answer.status} on {where}: {answer.message}")
            items.update({i: {**a, "lines": {tuple(pair) for pair in a["lines"]}} for i, a in answer["items"].items()})
            kernel_coverage.merge(kernels, answer["kernels"])
            self.live.update(answer.get("live", {}))
        return items, kernels

    def shadowed(self, mutant: Mutant) -> tuple[int, int] | None:
        """The lines of the definition its module holds under the mutated function's name, where
        that is another one (runner.py, Note [A definition the module does not use]); else None."""
        span = self.live.get(mutant.file, {}).get(mutant.function)
        return span if mutant.jit and span is not None and not span[0] <= mutant.line <= span[1] else None

    def reached(self, mutant: Mutant, passing: list[int], items: dict, traced: set[str], kernels: dict) -> list[int]:
        """The passing items that run the mutated statement: those of the ops whose cases launched its
        function or a kernel calling it (any kernel of its file, for host code), and where its lines
        were traced, those whose cases ran that line; none for a kernel nobody launched or called."""
        if self.shadowed(mutant) is not None:
            return []
        known = launched_in([r for records in kernels.values() for r in records.values()], mutant.file)
        names = {mutant.function} | jit_callers(mutant.file, known).get(mutant.function, frozenset())
        ops = {scope for scope, records in kernels.items()
               if any(r["file"] == mutant.file and (r["name"] in names or not mutant.jit) for r in records.values())}
        candidates = [i for i in passing if self.items[i].op in ops
                      or (kernel_coverage.OUTSIDE in ops and self.items[i].kind == "float64")]
        if not mutant.jit or mutant.kernel_key not in traced:  # host code, or a GPU: no lines to go by
            return candidates
        wanted = (mutant.kernel_key, mutant.statement)
        return [i for i in candidates if wanted in items[i]["lines"]]

    def order(self, reached: list[int], items: dict) -> list[int]:
        return sorted(reached, key=lambda i: (-self.kills[i], items[i]["seconds"]))

    def run(self, limit: int | None, json_path: str | None, progress) -> int:
        """The whole run, with the cases' references kept in a scratch folder from the baseline to
        the last mutant (runner.py, Note [References made once])."""
        self.cache = tempfile.mkdtemp(prefix="oracle-mutate-references-")
        try:
            return self._run(limit, json_path, progress)
        finally:
            shutil.rmtree(self.cache, ignore_errors=True)

    def _run(self, limit: int | None, json_path: str | None, progress) -> int:
        started = time.monotonic()
        print(f"oracle.mutate: {self.impl} on {', '.join(self.ops)}: baseline of {len(self.items)} item(s) on "
              f"{self.workers} worker(s), {self.device}", file=sys.stderr, flush=True)
        try:
            items, kernels = self.baseline()
        except RuntimeError as exc:
            print(f"oracle.mutate: {exc}", file=sys.stderr)
            return 2
        failing = [i for i, answer in items.items() if answer["status"] not in ("pass", "skipped")]
        for i in failing:
            print(f"oracle.mutate: the unmutated {self.impl} fails {self.labels[i]}; left out of the mutant runs:\n"
                  f"  {items[i]['message']}", file=sys.stderr)
        passing = sorted(i for i, answer in items.items() if answer["status"] == "pass")
        records = [r for scope in kernels.values() for r in scope.values()]
        unique = {(r["file"], r["name"]): r for r in records}
        traced = {kernel_coverage.KernelSource(r["name"], r["file"], r["first_line"], (), frozenset()).key
                  for r in records if r["traced"]}
        mutants = [m for m in mutants_of_kernels(list(unique.values()))
                   if m.operator in self.operators and on_lines(m, self.lines)][:limit]
        print(f"oracle.mutate: baseline {len(passing)} of {len(items)} item(s) passed in {time.monotonic() - started:.0f} s "
              f"({sum(a['seconds'] for a in items.values()):.0f} s of work); {len(mutants)} mutant(s) of "
              f"{len({(m.file, m.function) for m in mutants})} function(s) in {len({m.file for m in mutants})} file(s)",
              file=sys.stderr, flush=True)
        results = self.mutants(mutants, passing, items, traced, kernels, progress)
        status = None
        if self.gate is not None:
            try:
                results = self.gated_results(results, progress)
            except RuntimeError as exc:  # the unmutated implementation fails the gate: it judges nothing
                print(f"oracle.mutate: {exc}", file=sys.stderr)
                status = 2
        title = f"{self.impl} on {', '.join(self.ops)}, {self.device}"
        print("\n".join(score.report_lines(results, title, self.gated)))
        print(f"oracle.mutate: {time.monotonic() - started:.0f} s in all", file=sys.stderr)
        if json_path:
            self.write(json_path, results, title, time.monotonic() - started)
        if status is not None:
            return status
        return 0 if all(r.verdict in (score.KILLED, score.EQUIVALENT) for r in results) else 1

    def mutants(self, mutants, passing, items, traced, kernels, progress) -> list[score.Judged]:
        reach = {m.number: self.reached(m, passing, items, traced, kernels) for m in mutants}
        seconds = {m.number: sum(items[i]["seconds"] for i in reach[m.number]) for m in mutants}

        def make(m):
            return lambda: ("mutant", {"mutant": m, "items": self.items, "order": self.order(reach[m.number], items),
                                       "impl": self.impl, "op_modules": self.op_modules, "scratch": scratch,
                                       "cache": self.cache})

        jobs = [(m.number, make(m), 3 * seconds[m.number] + FORK_AND_IMPORT_S) for m in mutants if reach[m.number]]
        scratch = tempfile.mkdtemp(prefix="oracle-mutate-")
        try:
            answers = run_all(jobs, self.workers, self.gpu, self._learning(progress(len(jobs), time.monotonic())),
                              self.stop_at)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        specialisations = {}
        for scope in kernels.values():
            for r in scope.values():
                specialisations.setdefault(r["name"], set()).update(r["specialisations"])
        records = [r for scope in kernels.values() for r in scope.values()]
        return [score.judged(m, reach[m.number], answers.get(m.number), items, self.labels,
                             sorted(specialisations[m.function]) if m.function in specialisations else None,
                             launched_in(records, m.file), self.shadowed(m))
                for m in mutants]

    def _learning(self, show):
        """The progress callback, which also counts each killing item once (``order`` tries those first)."""
        counted: set = set()

        def seen(answers):
            for key, answer in answers.items():
                if key not in counted and answer.status != "pass" and answer.item is not None:
                    self.kills[answer.item] += 1
                    counted.add(key)
            show(answers)
        return seen

    def write(self, path: str, results, title: str, seconds: float) -> None:
        data = {"title": title, "impl": self.impl, "ops": self.ops, "device": str(self.device),
                "items": len(self.items), "seconds": round(seconds, 1), "score": score.score(results),
                "catches": score.catches(results),
                **({"gate": self.gated} if self.gated is not None else {}),
                "mutants": [r.to_json() for r in results]}
        Path(path).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")

    # --- the gate where a baseline is given (oracle/mutate/gate.py, Note [The gate judges the survivors])

    def gated_results(self, results: list[score.Judged], progress) -> list[score.Judged]:
        """``results`` with the suite's survivors judged by the gate: those it flags killed."""
        survivors = [r for r in results if r.verdict in score.SURVIVED]
        self.gated = {"baseline": self.gate.path, "grid": self.gate.grid, "tasks": len(self.gate.tasks),
                      "judged": 0, "killed": 0}
        if not survivors:
            return results
        reference = self.gate_reference()
        reach = {r.mutant.number: self.gate_reach(r.mutant, reference) for r in survivors}

        def make(m):
            order = sorted(reach[m.number], key=lambda t: reference["seconds"][t])
            return lambda: (mutate_gate.mutant_work, {
                "mutant": m, "plan": self.gate, "order": order, "reference": reference["answers"],
                "environment": reference["environment"], "impl": self.impl, "op_modules": self.op_modules,
                "scratch": scratch})

        jobs = [(r.mutant.number, make(r.mutant),
                 3 * sum(reference["seconds"][t] for t in reach[r.mutant.number]) + FORK_AND_IMPORT_S)
                for r in survivors if reach[r.mutant.number]]
        print(f"oracle.mutate: the gate judges {len(jobs)} of {len(survivors)} survivor(s) (the others run no task "
              f"of its grid)", file=sys.stderr, flush=True)
        scratch = tempfile.mkdtemp(prefix="oracle-mutate-gate-")
        try:
            answers = run_all(jobs, self.workers, self.gpu, progress(len(jobs), time.monotonic()), self.stop_at)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        labels = {t.id: t.label for t in self.gate.tasks}
        judged = [score.gated(r, answers.get(r.mutant.number), labels) for r in results]
        self.gated.update(judged=sum(r.mutant.number in answers for r in survivors),
                          killed=sum(r.by_gate for r in judged))
        return judged

    def gate_reference(self) -> dict:
        """The unmutated implementation on the gate's tasks, split over the workers: per task its
        answer, lines and time, and the environment; raises RuntimeError where it fails the gate."""
        tasks = self.gate.tasks
        print(f"oracle.mutate: the gate: the unmutated {self.impl} on {self.gate.summary()}", file=sys.stderr,
              flush=True)
        chunks = [list(range(i, len(tasks), self.workers)) for i in range(min(self.workers, len(tasks)))]
        jobs = [(n, (lambda chunk=chunk: (mutate_gate.reference_work, {
                    "tasks": tasks, "chosen": chunk, "impl": self.impl, "op_modules": self.op_modules})),
                 BASELINE_TIMEOUT_S) for n, chunk in enumerate(chunks)]
        reference = {"answers": {}, "lines": {}, "seconds": {}, "environment": None}
        for n, answer in sorted(run_all(jobs, self.workers, self.gpu).items()):
            if isinstance(answer, Outcome):
                where = tasks[answer.item].label if answer.item is not None else "loading it"
                raise RuntimeError(f"the gate: the unmutated {self.impl} {answer.status} on {where}: {answer.message}")
            for name in ("answers", "seconds"):
                reference[name].update(answer[name])
            reference["lines"].update({t: {tuple(pair) for pair in ran} for t, ran in answer["lines"].items()})
            reference["environment"] = reference["environment"] or answer["environment"]
        problem = mutate_gate.regression(self.gate, reference["answers"], reference["environment"], self.impl)
        if problem:
            raise RuntimeError(f"the unmutated {self.impl} fails the gate against {self.gate.path}, so the gate "
                               f"could tell no mutant from it: {problem}")
        return reference

    def gate_reach(self, mutant: Mutant, reference: dict) -> list[int]:
        """The gate's tasks that run the mutated statement: where lines are traced (a kernel, on a
        CPU), those whose unmutated run ran it; every task for host code and on a GPU."""
        tasks = [t.id for t in self.gate.tasks]
        if not mutant.jit or self.gpu:
            return tasks
        wanted = (mutant.kernel_key, mutant.statement)
        return [t for t in tasks if wanted in reference["lines"][t]]
