"""The report document: one JSON object (schema ``kernel-oracle/drift/3``, documented in docs/reference/json-schema.md)
that the terminal table, the HTML dashboard, the gate and the committed baselines all read; a
baseline is the document in the stable form of ``baseline_view``."""

from __future__ import annotations

import datetime
import hashlib
import json
import sys
from collections import defaultdict
from pathlib import Path

from oracle import kernel_coverage
from oracle.cases import Case
from oracle.engine import repro_command
from oracle.environment import git_repository, repository
from oracle.declare.registry import SPECS
from oracle.report.sweep import Task, columns_of

SCHEMA = "kernel-oracle/drift/3"  # 3: each cell's data identity, the host's maths; 2: per-element metrics
MIXED_HOSTS = "several:"  # the host-maths digest of a run merged from hosts that round HF otherwise


def cell_key(case: Case, tensor: str) -> str:
    """Stable across runs of the same grid: op/variant/dtype/case label/tensor."""
    return f"{case.op}/{case.variant}/{case.dtype}/{case.label}/{tensor}"


def data_identity(case: Case) -> str:
    """What a cell's data is made from: the whole case (dims, layout, values, params, seed), hashed.
    Two grids may give one label to other data (the quick grid and the full one reuse labels with
    other seeds); the gate compares cells only where this matches."""
    return data_identity_of(case.record())


def data_identity_of(case: dict) -> str:
    """data_identity of a case description as a document holds it."""
    return hashlib.sha256(case_identity(case).encode()).hexdigest()[:16]


def cell_keys(tasks: list[Task]) -> set[tuple[str, str]]:
    """(key, data identity) of the cells a sweep of ``tasks`` will produce (build), known before it runs."""
    return {(cell_key(task.case, tensor), data_identity(task.case)) for task in tasks if task.kind == "case"
            for tensor in SPECS[task.case.op].compared()}


def declared_ops(ops) -> dict[str, str]:
    """The declared ops among ``ops`` (not the harness's own, oracle/ops/), each with its module."""
    from oracle.ops import MODULES
    from oracle.declare.registry import where

    built_in = {spec.name for module in MODULES for spec in module.SPECS}
    return {op: where(op) for op in sorted(set(ops)) if op not in built_in}


def project(op_modules) -> dict | None:
    """The user's repository, beside the harness's (environment.harness): the working directory's
    git repository, or else that of the first module of declared ops that is in one; None where that
    is the harness's own checkout (or no repository). Recorded as environment.repository records one
    (its name, a path inside it, its commit), the path being that of the first module of declared ops
    inside it, else the working directory's; ``from`` says which repository it is."""
    harness = git_repository(Path(__file__).resolve().parent)
    files = {name: Path(module.__file__).resolve() for name in dict.fromkeys(op_modules)
             if getattr(module := sys.modules.get(name), "__file__", None)}
    places = [(Path.cwd(), "the working directory")]
    places += [(file.parent, f"the op module {name}") for name, file in files.items()]
    for folder, how in places:
        found = git_repository(folder)
        if found and (harness is None or found[0] != harness[0]):
            root = Path(found[0]).resolve()
            inside = [file for file in files.values() if file.is_relative_to(root)]
            return {**repository(inside[0] if inside else folder, found), "from": how}
    return None


def build(tasks: list[Task], answers: dict[int, dict], impl: str, grid: str, environment: dict,
          seconds: float) -> dict:
    cells, cases, checks = [], [], []
    for task in tasks:
        answer = answers[task.id]
        case = task.case
        if task.kind == "case":
            result = answer["result"]
            cases.append(result)
            verdicts = {v["name"]: v for v in result["verdicts"]}
            for tensor in SPECS[case.op].compared():
                verdict = verdicts.get(tensor)
                status = ("pass" if verdict["passed"] else "fail") if verdict else result["status"]
                if verdict and result["status"] == "fail" and verdict["passed"] and result["findings"]:
                    status = "pass"  # the case failed on a finding, not on this tensor's numbers
                cells.append({"key": cell_key(case, tensor), "identity": data_identity(case), "op": case.op,
                              "variant": case.variant,
                              "dtype": case.dtype, "label": case.label, "tensor": tensor, "columns": columns_of(case),
                              "layout": case.layout, "status": status, "metrics": verdict})
        else:
            checks.append({"op": case.op, "variant": case.variant, "dtype": case.dtype, "check": task.check,
                           "case": case.record(), "findings": answer["findings"], "seconds": answer.get("seconds", 0.0),
                           "repro": repro_command(case, impl, task.check)})
    failures = [{"kind": "case", "status": r["status"], "summary": Case(**r["case"]).summary(), "repro": r["repro"],
                 "explain": r.get("explain") or r["error"]} for r in cases if r["status"] != "pass"]
    failures += [{"kind": "check", "status": "finding", "summary": f"{c['check']} on {Case(**c['case']).summary()}",
                  "repro": c["repro"], "explain": "\n".join(f"[{f['check']}] {f['tensor']}: {f['message']}"
                                                            for f in c["findings"])}
                 for c in checks if c["findings"]]
    return {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "impl": impl,
        "sweep": grid,  # sweep.grid_name
        "seconds": seconds,
        "environment": environment,
        "declared": (declared := declared_ops(task.case.op for task in tasks)),
        "project": project(declared.values()),
        "summary": summarize(cells, checks, cases),
        "cells": cells,
        "cases": cases,
        "aliasing": checks,
        "failures": failures,
        "kernel_coverage": kernel_coverage_of(answers[task.id] for task in tasks),
    }


def kernel_coverage_of(answers) -> dict:
    """The tasks' kernel coverage merged, in the report's form (kernel_coverage.for_report): per op
    and kernel, the lines run and never reached, the source marked, specialisations and configs."""
    merged: dict = {}
    for answer in answers:
        kernel_coverage.merge(merged, answer.get("kernel_coverage") or {})  # a crashed task's answer has none
    return kernel_coverage.for_report(merged)


# Differ from run to run of the same code: timings, the moment of the run, and a comparison with the
# baseline that was current then. A baseline without them changes only where results change.
VOLATILE_FIELDS = ("created", "seconds", "baseline")


def baseline_view(document: dict) -> dict:
    """``document`` as a baseline: no volatile fields, cells sorted by key, cases by what they run
    and the aliasing checks by check and case, so that the git diff of an update shows only what
    changed (environment.write_json_atomic sorts the keys and fixes the indent). Every other value is
    kept."""
    view = {name: value for name, value in document.items() if name not in VOLATILE_FIELDS}
    view["cells"] = sorted(document["cells"], key=lambda cell: cell["key"])
    view["cases"] = sorted(map(_without_volatile, document["cases"]), key=lambda r: _case_order(r["case"]))
    view["aliasing"] = sorted(map(_without_volatile, document["aliasing"]),
                              key=lambda c: (c["check"], *_case_order(c["case"])))
    if "kernel_coverage" in document:
        view["kernel_coverage"] = _coverage_without_counts(document["kernel_coverage"])
    return view


def _coverage_without_counts(coverage: dict) -> dict:
    """Kernel coverage with the specialisations and configs seen, not how often: on a GPU a launch is
    recorded on each process's first launch of a signature (oracle/kernel_coverage/collect.py), so
    the counts follow how the report's workers shared the cases, and two runs of one grid gave two
    baselines (tests/test_gate.py's update twice, on the H200)."""
    return {op: {key: {**record, "specialisations": sorted(record.get("specialisations", {})),
                       "configs": sorted(record.get("configs", {}))}
                 for key, record in kernels.items()}
            for op, kernels in coverage.items()}


def case_identity(case: dict) -> str:
    """A case description as canonical JSON. Not Case.label: that follows the order of ``dims``, which
    differs between a case fresh from a sweep and one read back from a file with sorted keys."""
    return json.dumps(case, sort_keys=True, separators=(",", ":"))


def _case_order(case: dict) -> tuple[str, ...]:
    return case["op"], case["variant"], case["dtype"], case_identity(case)


def _without_volatile(record: dict) -> dict:
    return {name: value for name, value in record.items() if name not in VOLATILE_FIELDS}


def _fraction(value: float, bound: float) -> float:
    return value / bound if bound > 0 else (0.0 if value == 0 else float("inf"))


def typical_excess(metrics: dict) -> float:
    """How much of the distribution judgement's allowance a tensor used: 0 when its typical error is
    no worse than the worse of HF's two orders, 1 at the bound (above fails). A share of the bound
    itself would put every kernel as accurate as HF near 100% in 16-bit, where the bound is tight."""
    reference = max(metrics["hf_mean_error"], metrics["reordered_mean_error"])
    return _fraction(max(0.0, metrics["mean_error"] - reference), metrics["mean_bound"] - reference)


def summarize(cells: list[dict], checks: list[dict], cases: list[dict]) -> list[dict]:
    """One row per op, variant, dtype and tensor: how many cells passed, the worst ratio and ULPs,
    the worst element as a fraction of its bound and the typical error's use of its allowance
    (results.typical_excess), the lowest bit-identity to HF,
    and the aliasing findings for that op and dtype."""
    rows: dict[tuple, dict] = {}
    findings = defaultdict(int)
    for check in checks:
        findings[(check["op"], check["dtype"])] += len(check["findings"])
    for result in cases:
        case = result["case"]
        findings[(case["op"], case["dtype"])] += len(result["findings"])
    for cell in cells:
        key = (cell["op"], cell["variant"], cell["dtype"], cell["tensor"])
        row = rows.setdefault(key, {"op": key[0], "variant": key[1], "dtype": key[2], "tensor": key[3], "cells": 0,
                                    "passed": 0, "worst_ratio": 0.0, "min_bit_identical": 1.0, "max_ulp": 0.0,
                                    "worst_element": 0.0, "worst_typical": 0.0,
                                    "findings": findings[(key[0], key[2])]})
        row["cells"] += 1
        row["passed"] += cell["status"] == "pass"
        metrics = cell["metrics"]
        if metrics:
            row["worst_ratio"] = max(row["worst_ratio"], metrics["error_ratio"])
            row["min_bit_identical"] = min(row["min_bit_identical"], metrics["bit_identical"])
            row["max_ulp"] = max(row["max_ulp"], metrics["ulp_max"])
            # the other two judgements, as fractions of their bounds (above 1 fails)
            if metrics.get("element_max") is not None:
                row["worst_element"] = max(row["worst_element"], metrics["element_max"] / metrics["element_bound"])
                row["worst_typical"] = max(row["worst_typical"], typical_excess(metrics))
    return list(rows.values())


def run_noise_model(document: dict) -> str:
    """The noise model a run's verdicts were judged by (runs that predate the record: ``declared``, the default then)."""
    return (document.get("environment") or {}).get("noise_model") or "declared"
