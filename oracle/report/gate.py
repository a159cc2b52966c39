"""Baselines and the regression gate.

A baseline is a report document (results.py) stored under reports/ for one platform, in the stable
form of results.baseline_view (no timings, a fixed order); the gate compares a run with it cell by
cell.

Note [Drift or regression]
    A cell regresses when

    - it passed and now fails (or errors, or crashes);
    - it now has non-finite values it did not have, or more non-finite mismatches with HF;
    - precision was lost: its typical error grew beyond what another valid evaluation may move it
      (``precision_lost``). The typical error is the distribution judgement's (compare.py, Note
      [The distribution judgement]): the mean of the errors against the truth, each in units of its
      element's own scale (its ULP and the rounding HF's evaluation carries there). It grew too far
      when either

      1. it rose above the baseline's by more than the room the verdict gives an implementation
         above HF's: two more roundings in the compute dtype, the other orders of long sums, fast
         maths' typical size and four standard errors of sampling noise (``mean_bound`` less its
         reference, kept with every cell): the distribution judgement, with the kernel's own
         baseline in HF's place; or
      2. it rose by more than half a bit, a factor of sqrt(2), beyond four standard errors of the
         ratio of two means of n errors (``exp(4 sqrt(2/n))``): a relative rule, for noise models
         so wide that their room in 1. exceeds the whole typical error. RMSNorm's hand-written dW
         is one: its partial sums added in bf16 (Liger-Kernel #950's kind; 4096 rows of 256
         columns, tiles of 16 rows) take its typical error from 0.0055 to 0.044, eight times, yet
         inside rule 1's room of 0.073.

    and a run regresses when a case or an aliasing check reports a finding it did not before.

    Everything else that moved is drift: a cell that passes before and after with its typical
    error inside that room is listed as changed, with its error ratio to HF and its bit-identity
    before and after, and the gate exits 0. Why this separates them: a reassociation
    (``(1 - t*t) * dy * g`` as ``(1 - t) * (1 + t) * (dy * g)``) is another valid order of the same
    maths in the compute dtype; it moves each element by about one float32 rounding, well inside
    rule 1's two such roundings (measured: at most 0.06 of that room in float32, no change in
    bfloat16, where the result's own rounding hides it). Its error ratio to HF and its
    bit-identity may move a lot (9.79 -> 16.4 where HF happened to be near exact), but those
    measure the distance to HF's bits, not precision. Partial sums rounded to 16 bits add a 16-bit
    rounding per partial: thousands of float32 roundings, so a float32 cell fails outright, and a
    bfloat16 one that still passes exceeds rule 1's room (1.5 and 1.7 times it, measured on
    24 rows of 1000 columns in two row blocks), or rule 2's factor under a loose noise model.

    None of these rules reads HF's bits but through an element's scale, where HF's own error is
    room under the derived noise model: so the verdict is the same whichever vector maths the
    runner's CPU has (AVX-512, AVX2 or none: environment.py, Note [Host maths]); the error ratio
    and bit-identity, which move with it, are reported, never judged.

Note [What the gate judges]
    The gate never passes what it did not judge. Baseline cells missing from the run, and run
    cells missing from the baseline, are named with the reason, and only two reasons are a slice
    that was asked for: a filter (``--ops``, ``--dtypes``, ``--variants``) and a single shard gated
    alone (``--shard K/N``). Any other (a quick run against a full baseline, an op the baseline
    lacks, an op the implementation lacks, the same label on other data, a missing shard) makes
    the gate exit 2, naming what is missing, before the sweep where the plan shows it.

A gate must not pass by accident, so a baseline is validated completely before the sweep starts
(baseline_problem): every field the gate reads is there and every number it compares is finite.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from oracle.cases import Case
from oracle.verdict import SAMPLING_SDS
from oracle.report.results import MIXED_HOSTS, SCHEMA, case_identity, data_identity_of, run_noise_model
from oracle.errors import BaselineError  # noqa: F401 - raised here

# Drift worth listing (never a regression by itself, Note [Drift or regression]): an error ratio to
# HF beyond ratio * (1 + RATIO_MARGIN) + RATIO_SLACK, or a bit-identity that moved by more than
# BIT_IDENTITY_MARGIN. Both measure the distance to HF's bits, which move with the host's maths.
RATIO_MARGIN = 0.25
RATIO_SLACK = 0.05
BIT_IDENTITY_MARGIN = 0.01
HALF_A_BIT = math.sqrt(2)  # Note [Drift or regression], rule 2

# What the gate reads of a cell's metrics; a NaN would switch its rule off without a word.
METRIC_FIELDS = ("error_ratio", "bit_identical", "nonfinite_k", "nonfinite_mismatches")
# The distribution judgement's numbers (compare.py): precision_lost reads them where a cell has them.
TYPICAL_FIELDS = ("mean_error", "mean_bound", "hf_mean_error", "reordered_mean_error")
# Cells missing from one side for a reason that is a slice asked for (Note [What the gate judges]).
ASKED = ("filtered out by", "in another shard than")
# results.build: pass/fail cells carry their tensor's verdict; error, crash and skipped ones have none.
MEASURED = ("pass", "fail")
STATUSES = (*MEASURED, "error", "crash", "skipped")



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
    typical = [field for field in TYPICAL_FIELDS if metrics.get(field) is not None]  # a verdict may lack them
    return next(filter(None, (_metric_problem(metrics, field) for field in (*METRIC_FIELDS, *typical))), None)


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
    """Per-cell deltas, the regressions (each a line a person can act on), the drift, why baseline
    cells went unjudged, and what the run holds that the baseline does not. Raises BaselineError for
    a malformed baseline; the run is read defensively (a stored one may be old), and a run cell
    missing a number the rules need regresses."""
    problem = structure_problem(baseline)
    if problem:
        raise BaselineError(f"the baseline is malformed: {problem}")
    before = {cell["key"]: cell for cell in baseline["cells"]}
    run_cells = [cell for cell in current.get("cells") or () if isinstance(cell, dict)]
    same_impl = current.get("impl") == baseline.get("impl")
    deltas, regressions, drift, unjudged, judged_identities = [], [], [], Counter(), set()
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
        problems = _cell_regressions(cell, old)
        changed = [] if problems else _drift(cell, old)
        deltas.append(_delta(cell, old, problems, changed))
        regressions += [f"{cell['key']}: {p}" for p in problems]
        drift += [f"{cell['key']}: {c}" for c in changed]
        judged_identities.add(cell.get("identity"))
    regressions += _new_findings(current, baseline)
    now_keys = {cell.get("key") for cell in run_cells}
    missing = sorted(before.keys() - now_keys)
    unjudged.update(_why_absent(before[key], selection, current, baseline.get("sweep")) for key in missing)
    new_cells = sorted(now_keys - before.keys())
    return {"deltas": deltas, "regressions": regressions, "drift": drift, "judged": len(deltas),
            "not_judged": dict(unjudged.most_common()), "new_cells": new_cells, "missing_cells": missing,
            "new": _why_new(new_cells, run_cells, baseline, current.get("sweep")),
            "sizes": _sizes(current, judged_identities),
            "hf_relative": same_host_maths(current, baseline) or _maths_difference(current, baseline)}


def unasked(comparison: dict) -> list[str]:
    """What went unjudged without being asked to (Note [What the gate judges]): each a clause."""
    out = [f"{n} baseline cell{'' if n == 1 else 's'} {reason}" for reason, n in comparison["not_judged"].items()
           if not reason.startswith(ASKED)]
    return out + [f"{n} cell{'' if n == 1 else 's'} of this run {reason}" for reason, n in
                  (comparison.get("new") or {}).items()]


def coverage_problem(run_keys: set[tuple[str, str]], run_ops: set[str], baseline: dict, selection: Selection,
                     run_sweep: str, shard: tuple[int, int] | None, path: Path) -> str | None:
    """Before the sweep: the plan against the baseline, as compare() will judge them afterwards.
    A sentence naming what would go unjudged without being asked (a quick plan against a full
    baseline, an op the baseline lacks), or None."""
    from oracle.report.shards import identity_shard

    planned = {key for key, _ in run_keys}
    mine = {key: identity for key, identity in run_keys}
    missing = Counter()
    for cell in baseline["cells"]:
        if not selection.keeps(cell) or cell["key"] in planned and mine[cell["key"]] == cell["identity"]:
            continue
        if shard is not None and identity_shard(cell["identity"], shard[1]) != shard[0]:
            continue
        if cell["op"] not in run_ops:
            missing[f"of op {cell['op']}, which this run does not sweep"] += 1
        elif cell["key"] in planned:
            missing["under labels this run gives other data (another seed or case)"] += 1
        elif run_sweep != baseline.get("sweep"):
            missing[f"not in the {run_sweep} grid of this run (the baseline's is {baseline.get('sweep')})"] += 1
        else:
            missing["not in this run (renamed, or dropped from the grid)"] += 1
    stored = {c["key"] for c in baseline["cells"]}
    extra = [(key, identity) for key, identity in run_keys if key not in stored]
    new = _why_new([key for key, _ in extra], [{"key": k, "op": k.split("/", 1)[0]} for k, _ in extra], baseline,
                   run_sweep)
    clauses = [f"{n} baseline cell{'' if n == 1 else 's'} {why}" for why, n in missing.most_common()] + \
        [f"{n} planned cell{'' if n == 1 else 's'} {why}" for why, n in new.items()]
    if not clauses:
        return None
    return (f"this run and the baseline {path} hold different cells, and the gate never passes what it did not "
            f"judge: {'; '.join(clauses)}. Gate the baseline's grid (--full where it is full), name a slice with "
            "--ops/--dtypes/--variants, or store a new baseline on purpose with --update-baseline")


def _why_new(keys: list[str], run_cells: list[dict], baseline: dict, run_sweep: str | None) -> dict:
    """Why run cells have no baseline cell: their op is not in the baseline at all (named), or the
    grid differs."""
    if not keys:
        return {}
    ops_before = {cell["op"] for cell in baseline["cells"]}
    op_of = {cell.get("key"): cell.get("op") for cell in run_cells}
    out = Counter()
    for key in keys:
        op = op_of.get(key)
        if op not in ops_before:
            out[f"of op {op}, absent from the baseline"] += 1
        elif run_sweep != baseline.get("sweep"):
            out[f"in the {run_sweep} grid of this run, not in the baseline's {baseline.get('sweep')} grid"] += 1
        else:
            out["not in the baseline (the grid grew: sizes or cases the baseline was not made with)"] += 1
    return dict(out.most_common())


def _sizes(current: dict, identities: set) -> dict:
    """The sizes judged, per declared op and dim (results.build's ``declared``): what the last line
    names, as a declared op's grid is derived from its declaration (Dim's special sizes among them)."""
    declared = current.get("declared") or {}
    sizes: dict[str, dict[str, set]] = {}
    for record in current.get("cases") or ():
        case = record.get("case") if isinstance(record, dict) else None
        if not isinstance(case, dict) or case.get("op") not in declared or data_identity_of(case) not in identities:
            continue
        for dim, value in (case.get("dims") or {}).items():
            if isinstance(value, int):
                sizes.setdefault(case["op"], {}).setdefault(dim, set()).add(value)
    return {op: {dim: sorted(values) for dim, values in dims.items()} for op, dims in sorted(sizes.items())}


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
    return (f"changed error ratios and bit-identities partly HF's own: HF's maths rounds otherwise here (torch "
            f"{ours.get('cpu_capability')}, numpy {'/'.join(ours.get('numpy_simd') or []) or '-'}, digest "
            f"{ours.get('digest')}) than on the baseline's host (torch {theirs.get('cpu_capability')}, numpy "
            f"{'/'.join(theirs.get('numpy_simd') or []) or '-'}, digest {theirs.get('digest')})")


def _delta(cell: dict, old: dict, problems: list[str], changed: list[str]) -> dict:
    m, b = cell.get("metrics"), old["metrics"]
    m = m if isinstance(m, dict) else None
    return {"key": cell["key"], "status": f"{old['status']} -> {cell.get('status')}",
            "ratio_before": b and b["error_ratio"], "ratio_now": m and m.get("error_ratio"),
            "bit_identical_before": b and b["bit_identical"], "bit_identical_now": m and m.get("bit_identical"),
            "typical_before": b and b.get("mean_error"), "typical_now": m and m.get("mean_error"),
            "regression": "; ".join(problems), "drift": "; ".join(changed)}


def _cell_regressions(now: dict, before: dict) -> list[str]:
    """Note [Drift or regression]. ``before`` is a validated baseline cell; ``now`` is read
    defensively (a stored run may be old)."""
    out = []
    if before["status"] == "pass" and now.get("status") != "pass":
        out.append(f"passed before, now {now.get('status')}")
    m, b = now.get("metrics"), before["metrics"]
    if not (isinstance(m, dict) and b):
        return out
    needed = (*METRIC_FIELDS, *(field for field in TYPICAL_FIELDS if b.get(field) is not None))
    broken = [field for field in needed if _metric_problem(m, field)]
    if broken:  # a number the rules need is gone: never let that switch a rule off
        return out + [f"{field} {b[field]} -> {m.get(field)!r}" for field in broken]
    if m["nonfinite_k"] > b["nonfinite_k"] or m["nonfinite_mismatches"] > b["nonfinite_mismatches"]:
        out.append(f"non-finite values {b['nonfinite_k']} -> {m['nonfinite_k']} "
                   f"(mismatches {b['nonfinite_mismatches']} -> {m['nonfinite_mismatches']})")
    lost = precision_lost(m, b)
    if lost:
        out.append(lost)
    return out


def typical_room(metrics: dict) -> float:
    """The room the distribution judgement gives an implementation above HF's typical error (two
    compute-dtype roundings, long sums' other orders, fast maths, sampling noise): its bound less
    its reference, compare.py's ``mean_bound = max(h, r) + |h - r| + room``."""
    h, r = metrics["hf_mean_error"], metrics["reordered_mean_error"]
    return max(0.0, metrics["mean_bound"] - max(h, r) - abs(h - r))


def half_a_bit(metrics: dict) -> float:
    """Rule 2's factor: half a bit beyond SAMPLING_SDS standard errors of the ratio of two means of
    n errors (a coefficient of variation of at most 1 each)."""
    n = max(1, math.prod(metrics.get("shape") or [1]))
    return HALF_A_BIT * math.exp(SAMPLING_SDS * math.sqrt(2 / n))


def precision_lost(now: dict, before: dict) -> str | None:
    """Note [Drift or regression], rules 1 and 2, on two cells' metrics: the regression's words, or None."""
    if any(before.get(field) is None or now.get(field) is None for field in TYPICAL_FIELDS):
        return None  # a verdict without the distribution judgement: nothing to compare
    was, is_ = before["mean_error"], now["mean_error"]
    room = max(typical_room(before), typical_room(now))
    factor = half_a_bit(before)
    if is_ > was + room:
        return (f"precision lost: typical error {was:.3g} -> {is_:.3g} (in units of each element's scale), more "
                f"than the {room:.3g} a valid evaluation may add")
    if was > 0 and is_ > was * factor:
        return (f"precision lost: typical error {was:.3g} -> {is_:.3g}, {is_ / was:.3g}x, more than half a bit "
                f"beyond sampling noise ({factor:.3g}x)")
    return None


def _drift(now: dict, before: dict) -> list[str]:
    """What moved in a cell that did not regress: its error ratio to HF, its bit-identity to HF and
    its typical error, reported (Note [Drift or regression])."""
    m, b = now.get("metrics"), before["metrics"]
    if not (isinstance(m, dict) and b):
        return []
    ratio_moved = not b["error_ratio"] / (1 + RATIO_MARGIN) - RATIO_SLACK <= m["error_ratio"] <= \
        b["error_ratio"] * (1 + RATIO_MARGIN) + RATIO_SLACK
    bits_moved = abs(m["bit_identical"] - b["bit_identical"]) > BIT_IDENTITY_MARGIN
    if not (ratio_moved or bits_moved):
        return []
    typical = f", typical error {b['mean_error']:.3g} -> {m['mean_error']:.3g}" \
        if b.get("mean_error") is not None and m.get("mean_error") is not None else ""
    return [f"changed within its verdict: error ratio {b['error_ratio']:.3g} -> {m['error_ratio']:.3g}, "
            f"bit-identical to HF {b['bit_identical']:.1%} -> {m['bit_identical']:.1%}{typical}"]


def _why_absent(cell: dict, selection: Selection, current: dict, baseline_sweep: str | None) -> str:
    from oracle.report.shards import identity_shard, missing_shard

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
    """Findings a case or an aliasing check reports now and did not in the baseline, each saying what
    it is: the check that found it, the tensor and its message. Cases are matched by their whole
    description (results.case_identity): a label read back from a file may differ."""
    def said(finding: dict) -> str:
        message = str(finding.get("message") or "").strip().splitlines()
        return f"{finding.get('tensor')}: {message[0][:200]}" if message else str(finding.get("tensor"))

    def case_findings(doc):  # identity -> (label, {check:tensor: finding})
        return {case_identity(r["case"]): (_case_label(r["case"]),
                                           {f"{f.get('check')}:{f.get('tensor')}": f for f in r.get("findings") or ()})
                for r in doc.get("cases") or () if isinstance(r, dict) and isinstance(r.get("case"), dict)}

    def check_findings(doc):
        return {f"{c.get('op')}/{c.get('dtype')}/{c.get('check')}": list(c.get("findings") or ())
                for c in doc.get("aliasing") or () if isinstance(c, dict)}

    out = []
    old_cases, new_cases = case_findings(baseline), case_findings(current)
    for identity, (label, found) in new_cases.items():
        added = found.keys() - old_cases[identity][1].keys() if identity in old_cases else set()
        out += [f"{label}: new finding of the {found[key].get('check')} check on {said(found[key])}"
                for key in sorted(added)]
    old_checks, new_checks = check_findings(baseline), check_findings(current)
    for key, found in new_checks.items():
        if key in old_checks and len(found) > len(old_checks[key]):
            check = key.rsplit("/", 1)[1]
            out.append(f"{key}: the {check} check reports {_count(len(found), 'finding')} (the baseline "
                       f"{len(old_checks[key])}), first {said(found[0])}")
    return out


def verdict_line(comparison: dict) -> str:
    """The gate's last line: what was judged, what was not and why, what is new, what drifted, the
    sizes of declared ops that were judged."""
    reasons = comparison["not_judged"]
    unjudged = sum(reasons.values())
    why = " (" + ", ".join(f"{n} {reason}" for reason, n in reasons.items()) + ")" if unjudged else ""
    regressions = _count(len(comparison["regressions"]), "regression")
    drift = len(comparison.get("drift") or ())
    drift = f", {drift} changed within {'its verdict' if drift == 1 else 'their verdicts'} (drift)" if drift else ""
    new = comparison.get("new") or {}
    new = " (" + ", ".join(f"{n} {reason}" for reason, n in new.items()) + ")" if new else ""
    sizes = comparison.get("sizes") or {}
    sizes = "; sizes judged: " + "; ".join(
        f"{op} " + ", ".join(f"{dim} {'/'.join(map(str, values))}" for dim, values in dims.items())
        for op, dims in sizes.items()) if sizes else ""
    partial = comparison.get("hf_relative", True)
    partial = f" ({partial})" if isinstance(partial, str) else ""
    return (f"gate: {_count(comparison['judged'], 'cell')} judged, {regressions}{drift}; "
            f"{_count(unjudged, 'baseline cell')} not judged{why}; {_count(len(comparison['new_cells']), 'new cell')}"
            f"{new}{sizes}{partial}")


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"
