"""Baselines and the regression gate.

A baseline is a report document (results.py) stored under reports/ for one platform, in the stable
form of results.baseline_view (no timings, a fixed order); the gate compares a run with it cell by
cell. A cell regresses when

- it passed and now fails (or errors, or crashes);
- its error ratio to HF grew beyond ``ratio * (1 + RATIO_MARGIN) + RATIO_SLACK``, or is no longer a number;
- its bit-identity to HF dropped by more than ``BIT_IDENTITY_MARGIN`` (absolute);
- it now has non-finite values it did not have, or more non-finite mismatches;

and a run regresses when a case or an aliasing check reports a finding it did not before. Cells
only one side has (a subset run, a new shape) are not judged, and the gate's last line says how
many and why.

Error ratio and bit-identity are measured against HF, whose bits depend on the host's vector
maths (environment.py, Note [Host maths]). Against a baseline made on a host whose maths rounds
otherwise (another ``host_maths.digest``) those two rules are not applied, and the last line says
so; the rules that are about the implementation alone (its verdicts, its non-finite values, its
findings) still are. A baseline made where HF rounds alike is judged in full. The margins absorb run-to-run noise (on the CPU runs are bit-for-bit repeatable;
cuBLAS-free GPU kernels nearly so) while a real change, such as one extra rounding step, moves
ratios by far more.

A gate must not pass by accident, so a baseline is validated completely before the sweep starts
(baseline_problem): every field the gate reads is there and every number it compares is finite.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..cases import Case
from .results import MIXED_HOSTS, SCHEMA, case_identity, run_noise_model

RATIO_MARGIN = 0.25
RATIO_SLACK = 0.05
BIT_IDENTITY_MARGIN = 0.01

# What the gate reads of a cell's metrics; a NaN would switch its rule off without a word.
METRIC_FIELDS = ("error_ratio", "bit_identical", "nonfinite_k", "nonfinite_mismatches")
# results.build: pass/fail cells carry their tensor's verdict; error, crash and skipped ones have none.
MEASURED = ("pass", "fail")
STATUSES = (*MEASURED, "error", "crash", "skipped")


class BaselineError(Exception):
    """The baseline cannot be used (missing, malformed, another platform): a usage error, exit 2."""


@dataclass(frozen=True)
class Selection:
    """The sweep's filters: a baseline cell they leave out is not judged, and not a regression."""

    ops: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    variants: tuple[str, ...] = ()

    @classmethod
    def of(cls, args) -> Selection:
        return cls(tuple(args.ops or ()), tuple(args.dtypes or ()), tuple(args.variants or ()))

    def _filters(self) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
        return ("op", "--ops", self.ops), ("dtype", "--dtypes", self.dtypes), ("variant", "--variants", self.variants)

    def keeps(self, cell: dict) -> bool:
        return all(not wanted or cell[field] in wanted for field, _, wanted in self._filters())

    def flags(self) -> str:
        return "/".join(flag for _, flag, wanted in self._filters() if wanted)


def default_baseline(platform: str) -> Path:
    return Path("reports") / f"baseline-{platform}.json"


def load_baseline(path: Path, platform: str, noise_model: str | None = None) -> dict:
    try:
        document = json.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise BaselineError(f"no baseline at {path}; create one with --update-baseline") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise BaselineError(f"baseline {path} is not readable JSON: {exc}") from exc
    problem = baseline_problem(document, platform, noise_model)
    if problem:
        raise BaselineError(f"baseline {path}: {problem}")
    return document


# --- validation: the first problem, as a clause that follows the file's name ----------------------

def baseline_problem(document, platform: str, noise_model: str | None = None) -> str | None:
    """Why ``document`` cannot serve as this platform's baseline for a run judged by ``noise_model``
    (None: any), or None."""
    if not isinstance(document, dict):
        return "the file is not a JSON object"
    if document.get("schema") != SCHEMA:
        return f"its schema is {document.get('schema')!r}, expected {SCHEMA!r}"
    environment = document.get("environment")
    theirs = environment.get("platform") if isinstance(environment, dict) else None
    if theirs != platform:
        return (f"it was made on {theirs!r}, this run is on {platform!r}; "
                "results differ legitimately between platforms, so pick that platform's baseline")
    judged_by = run_noise_model(document)
    if noise_model is not None and judged_by != noise_model:
        return (f"its verdicts were judged by the {judged_by} noise model, this run's by the {noise_model} one; "
                "a cell passes or fails by its model's bounds, so compare runs of one model")
    return structure_problem(document)


def structure_problem(document: dict) -> str | None:
    """The first malformed cell, case or aliasing check: what compare() would trip over."""
    return _cells_problem(document.get("cells")) or _cases_problem(document.get("cases")) \
        or _aliasing_problem(document.get("aliasing"))


def _cells_problem(cells) -> str | None:
    if not isinstance(cells, list) or not cells:
        return "it has no cells, so it could judge nothing"
    seen = set()
    for index, cell in enumerate(cells):
        name = cell.get("key") if isinstance(cell, dict) and isinstance(cell.get("key"), str) else f"#{index}"
        problem = _cell_problem(cell) or ("appears twice" if name in seen else None)
        if problem:
            return f"cell {name!r} {problem}"
        seen.add(name)
    return None


def _cell_problem(cell) -> str | None:
    if not isinstance(cell, dict):
        return "is not a JSON object"
    for field in ("key", "identity", "op", "variant", "dtype", "status"):
        if not isinstance(cell.get(field), str):
            return f"has no {field}"
    status, metrics = cell["status"], cell.get("metrics")
    if status not in STATUSES:
        return f"has an unknown status {status!r}"
    if metrics is None:
        return f"has status {status} but no metrics" if status in MEASURED else None
    if not isinstance(metrics, dict):
        return "has metrics that are not a JSON object"
    return next(filter(None, (_metric_problem(metrics, field) for field in METRIC_FIELDS)), None)


def _metric_problem(metrics: dict, field: str) -> str | None:
    if field not in metrics:
        return f"has no {field}"
    value = metrics[field]
    if not _is_number(value):
        return f"has a {field} that is not a number ({value!r})"
    if not math.isfinite(value):
        return f"has a non-finite {field} ({value})"
    return None


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cases_problem(cases) -> str | None:
    if not isinstance(cases, list):
        return "its 'cases' is not a list"
    for index, record in enumerate(cases):
        if not isinstance(record, dict) or _case_label(record.get("case")) is None:
            return f"case #{index} has no valid case description"
        if not _findings_well_formed(record.get("findings")):
            return f"case {_case_label(record['case'])!r} has malformed findings"
    return None


def _aliasing_problem(checks) -> str | None:
    if not isinstance(checks, list):
        return "its 'aliasing' is not a list"
    for index, check in enumerate(checks):
        if not isinstance(check, dict) or not all(isinstance(check.get(f), str) for f in ("op", "dtype", "check")):
            return f"aliasing check #{index} lacks its op, dtype or check"
        if not isinstance(check.get("findings"), list):
            return f"aliasing check #{index} has no list of findings"
    return None


def _findings_well_formed(findings) -> bool:
    return isinstance(findings, list) and all(
        isinstance(f, dict) and isinstance(f.get("check"), str) and isinstance(f.get("tensor"), str) for f in findings)


def _case_label(case) -> str | None:
    """The case's label, or None when the description is not one (an old or hand-edited file)."""
    if not isinstance(case, dict):
        return None
    try:
        return Case(**case).label
    except (TypeError, ValueError, AttributeError):
        return None


# --- comparison ------------------------------------------------------------------------------------

def check_overlap(run_keys: set[tuple[str, str]], baseline: dict, path: Path) -> None:
    """Before the sweep: a run that shares no cell with the baseline (renamed keys, another grid,
    the same labels on other data) could only pass by judging nothing."""
    if not run_keys & {(cell["key"], cell["identity"]) for cell in baseline["cells"]}:
        raise BaselineError(f"no cell of this run is in the baseline {path} ({len(run_keys)} cells planned, "
                            f"{len(baseline['cells'])} in the baseline, none in common with the same data: renamed "
                            "keys or another grid?), so the gate could judge nothing")


def compare(current: dict, baseline: dict, selection: Selection = Selection()) -> dict:
    """Per-cell deltas, the regressions (each a line a person can act on), and why baseline cells
    went unjudged. Raises BaselineError for a malformed baseline; the run is read defensively (a
    stored one may be old), and a run cell missing a number the rules need regresses."""
    problem = structure_problem(baseline)
    if problem:
        raise BaselineError(f"the baseline is malformed: {problem}")
    before = {cell["key"]: cell for cell in baseline["cells"]}
    run_cells = [cell for cell in current.get("cells") or () if isinstance(cell, dict)]
    same_impl = current.get("impl") == baseline.get("impl")
    hf_alike = same_host_maths(current, baseline)
    deltas, regressions, unjudged = [], [], Counter()
    for cell in run_cells:
        old = before.get(cell.get("key"))
        if old is None:
            continue
        if cell.get("identity") != old["identity"]:  # the same label on other data: nothing to compare
            unjudged["other data under the same label (another seed or case)"] += 1
            continue
        if cell.get("status") == "skipped" and not same_impl:
            unjudged["op missing from the implementation"] += 1  # another implementation may lack an op
            continue
        problems = _cell_regressions(cell, old, hf_alike)
        deltas.append(_delta(cell, old, problems))
        regressions += [f"{cell['key']}: {p}" for p in problems]
    regressions += _new_findings(current, baseline)
    now_keys = {cell.get("key") for cell in run_cells}
    missing = sorted(before.keys() - now_keys)
    unjudged.update(_why_absent(before[key], selection, current, baseline.get("sweep")) for key in missing)
    return {"deltas": deltas, "regressions": regressions, "judged": len(deltas),
            "not_judged": dict(unjudged.most_common()),
            "new_cells": sorted(now_keys - before.keys()), "missing_cells": missing,
            "hf_relative": hf_alike or _maths_difference(current, baseline)}


def _maths(document: dict) -> dict:
    environment = document.get("environment")
    maths = environment.get("host_maths") if isinstance(environment, dict) else None
    return maths if isinstance(maths, dict) else {}


def same_host_maths(current: dict, baseline: dict) -> bool:
    """Whether HF rounds alike in both runs (a baseline from before the fingerprint: assumed so; a
    run merged from hosts that round differently: never, shards.several_hosts)."""
    theirs, ours = _maths(baseline).get("digest"), _maths(current).get("digest")
    if any(str(d).startswith(MIXED_HOSTS) for d in (theirs, ours)):
        return False
    return theirs is None or ours is None or theirs == ours


def _maths_difference(current: dict, baseline: dict) -> str:
    theirs, ours = _maths(baseline), _maths(current)
    return (f"error ratio and bit-identity to HF not judged: HF's maths rounds otherwise here (torch "
            f"{ours.get('cpu_capability')}, numpy {'/'.join(ours.get('numpy_simd') or []) or '-'}, digest "
            f"{ours.get('digest')}) than on the baseline's host (torch {theirs.get('cpu_capability')}, numpy "
            f"{'/'.join(theirs.get('numpy_simd') or []) or '-'}, digest {theirs.get('digest')})")


def _delta(cell: dict, old: dict, problems: list[str]) -> dict:
    m, b = cell.get("metrics"), old["metrics"]
    m = m if isinstance(m, dict) else None
    return {"key": cell["key"], "status": f"{old['status']} -> {cell.get('status')}",
            "ratio_before": b and b["error_ratio"], "ratio_now": m and m.get("error_ratio"),
            "bit_identical_before": b and b["bit_identical"], "bit_identical_now": m and m.get("bit_identical"),
            "regression": "; ".join(problems)}


def _cell_regressions(now: dict, before: dict, hf_alike: bool = True) -> list[str]:
    """``before`` is a validated baseline cell; ``now`` is read defensively (a stored run may be old).
    ``hf_alike``: HF rounds alike in both runs, so the HF-relative rules apply."""
    out = []
    if before["status"] == "pass" and now.get("status") != "pass":
        out.append(f"passed before, now {now.get('status')}")
    m, b = now.get("metrics"), before["metrics"]
    if not (isinstance(m, dict) and b):
        return out
    broken = [field for field in METRIC_FIELDS if _metric_problem(m, field)]
    if broken:  # a number the rules need is gone: never let that switch a rule off
        return out + [f"{field} {b[field]} -> {m.get(field)!r}" for field in broken]
    if hf_alike and m["error_ratio"] > b["error_ratio"] * (1 + RATIO_MARGIN) + RATIO_SLACK:
        out.append(f"error ratio {b['error_ratio']:.3g} -> {m['error_ratio']:.3g}")
    if hf_alike and m["bit_identical"] < b["bit_identical"] - BIT_IDENTITY_MARGIN:
        out.append(f"bit-identical to HF {b['bit_identical']:.1%} -> {m['bit_identical']:.1%}")
    if m["nonfinite_k"] > b["nonfinite_k"] or m["nonfinite_mismatches"] > b["nonfinite_mismatches"]:
        out.append(f"non-finite values {b['nonfinite_k']} -> {m['nonfinite_k']} "
                   f"(mismatches {b['nonfinite_mismatches']} -> {m['nonfinite_mismatches']})")
    return out


def _why_absent(cell: dict, selection: Selection, current: dict, baseline_sweep: str | None) -> str:
    from .shards import identity_shard, missing_shard

    run_sweep = current.get("sweep")
    if not selection.keeps(cell):
        return f"filtered out by {selection.flags()}"
    lost = missing_shard(cell, current)
    if lost is not None:
        return f"in shard {lost}/{current['shards']['count']}, which is missing"
    shard = current.get("shard")
    if isinstance(shard, dict) and isinstance(cell.get("identity"), str) and \
            identity_shard(cell["identity"], shard["count"]) != shard["index"]:
        return f"in another shard than {shard['index']}/{shard['count']}"
    if run_sweep != baseline_sweep:
        return f"not in the {run_sweep} grid of this run (the baseline's is {baseline_sweep})"
    return "not in this run (renamed, or dropped from the grid)"


def _new_findings(current: dict, baseline: dict) -> list[str]:
    """Findings a case or an aliasing check reports now and did not in the baseline. Cases are matched
    by their whole description (results.case_identity): a label read back from a file may differ."""
    def case_findings(doc):  # identity -> (label, findings)
        return {case_identity(r["case"]): (_case_label(r["case"]),
                                           {f"{f.get('check')}:{f.get('tensor')}" for f in r.get("findings") or ()})
                for r in doc.get("cases") or () if isinstance(r, dict) and isinstance(r.get("case"), dict)}

    def check_findings(doc):
        return {f"{c.get('op')}/{c.get('dtype')}/{c.get('check')}": len(c.get("findings") or ())
                for c in doc.get("aliasing") or () if isinstance(c, dict)}

    out = []
    old_cases, new_cases = case_findings(baseline), case_findings(current)
    for identity, (label, found) in new_cases.items():
        added = found - old_cases[identity][1] if identity in old_cases else set()
        out += [f"{label}: new finding {finding}" for finding in sorted(added)]
    old_checks, new_checks = check_findings(baseline), check_findings(current)
    for key, count in new_checks.items():
        if key in old_checks and count > old_checks[key]:
            out.append(f"{key}: aliasing findings {old_checks[key]} -> {count}")
    return out


def verdict_line(comparison: dict) -> str:
    """The gate's last line: what was judged, what was not and why, and what is new."""
    reasons = comparison["not_judged"]
    unjudged = sum(reasons.values())
    why = " (" + ", ".join(f"{n} {reason}" for reason, n in reasons.items()) + ")" if unjudged else ""
    regressions = _count(len(comparison["regressions"]), "regression")
    partial = comparison.get("hf_relative", True)
    partial = f" ({partial})" if isinstance(partial, str) else ""
    return (f"gate: {_count(comparison['judged'], 'cell')} judged, {regressions}; "
            f"{_count(unjudged, 'baseline cell')} not judged{why}; {_count(len(comparison['new_cells']), 'new cell')}"
            f"{partial}")


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"
