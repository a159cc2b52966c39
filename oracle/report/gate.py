"""Baselines and the regression gate.

A baseline is a report document (results.py) stored under reports/ for one platform; the gate
compares a run with it cell by cell. A cell regresses when

- it passed and now fails (or errors, or crashes);
- its error ratio to HF grew beyond ``ratio * (1 + RATIO_MARGIN) + RATIO_SLACK``;
- its bit-identity to HF dropped by more than ``BIT_IDENTITY_MARGIN`` (absolute);
- it now has non-finite values it did not have, or more non-finite mismatches;

and a run regresses when a case or an aliasing check reports a finding it did not before. Cells
only one side has (a subset run, a new shape) are listed, not judged. The margins absorb run-to-run
noise (on the CPU runs are bit-for-bit repeatable; cuBLAS-free GPU kernels nearly so) while a real
change, such as one extra rounding step, moves ratios by far more.
"""

from __future__ import annotations

import json
from pathlib import Path

from .results import SCHEMA

RATIO_MARGIN = 0.25
RATIO_SLACK = 0.05
BIT_IDENTITY_MARGIN = 0.01


class BaselineError(Exception):
    """The baseline cannot be used (missing, malformed, another platform): a usage error, exit 2."""


def default_baseline(platform: str) -> Path:
    return Path("reports") / f"baseline-{platform}.json"


def load_baseline(path: Path, platform: str) -> dict:
    try:
        document = json.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise BaselineError(f"no baseline at {path}; create one with --update-baseline") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise BaselineError(f"baseline {path} is not readable JSON: {exc}") from exc
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise BaselineError(f"baseline {path} has schema {document.get('schema') if isinstance(document, dict) else None!r},"
                            f" expected {SCHEMA!r}")
    theirs = document.get("environment", {}).get("platform")
    if theirs != platform:
        raise BaselineError(f"baseline {path} was made on {theirs!r}, this run is on {platform!r}; "
                            "results differ legitimately between platforms, so pick that platform's baseline")
    return document


def _cell_regressions(now: dict, before: dict) -> list[str]:
    out = []
    if before["status"] == "pass" and now["status"] != "pass":
        out.append(f"passed before, now {now['status']}")
    m, b = now.get("metrics"), before.get("metrics")
    if m and b:
        if m["error_ratio"] > b["error_ratio"] * (1 + RATIO_MARGIN) + RATIO_SLACK:
            out.append(f"error ratio {b['error_ratio']:.3g} -> {m['error_ratio']:.3g}")
        if m["bit_identical"] < b["bit_identical"] - BIT_IDENTITY_MARGIN:
            out.append(f"bit-identical to HF {b['bit_identical']:.1%} -> {m['bit_identical']:.1%}")
        if m["nonfinite_k"] > b["nonfinite_k"] or m["nonfinite_mismatches"] > b["nonfinite_mismatches"]:
            out.append(f"non-finite values {b['nonfinite_k']} -> {m['nonfinite_k']} "
                       f"(mismatches {b['nonfinite_mismatches']} -> {m['nonfinite_mismatches']})")
    return out


def compare(current: dict, baseline: dict) -> dict:
    """Per-cell deltas and the regressions (each a line a person can act on)."""
    before = {cell["key"]: cell for cell in baseline["cells"]}
    deltas, regressions = [], []
    for cell in current["cells"]:
        old = before.get(cell["key"])
        if old is None:
            continue
        m, b = cell.get("metrics"), old.get("metrics")
        delta = {"key": cell["key"], "status": f"{old['status']} -> {cell['status']}",
                 "ratio_before": b and b["error_ratio"], "ratio_now": m and m["error_ratio"],
                 "bit_identical_before": b and b["bit_identical"], "bit_identical_now": m and m["bit_identical"]}
        problems = _cell_regressions(cell, old)
        delta["regression"] = "; ".join(problems)
        deltas.append(delta)
        regressions += [f"{cell['key']}: {p}" for p in problems]
    regressions += _new_findings(current, baseline)
    now_keys = {c["key"] for c in current["cells"]}
    return {"deltas": deltas, "regressions": regressions,
            "new_cells": sorted(now_keys - before.keys()), "missing_cells": sorted(before.keys() - now_keys)}


def _new_findings(current: dict, baseline: dict) -> list[str]:
    def case_findings(doc):
        return {_case_label(r["case"]): {f"{f['check']}:{f['tensor']}" for f in r["findings"]} for r in doc["cases"]}

    def check_findings(doc):
        return {f"{c['op']}/{c['dtype']}/{c['check']}": len(c["findings"]) for c in doc["aliasing"]}

    out = []
    old_cases, new_cases = case_findings(baseline), case_findings(current)
    for label, found in new_cases.items():
        added = found - old_cases.get(label, set()) if label in old_cases else set()
        out += [f"{label}: new finding {finding}" for finding in sorted(added)]
    old_checks, new_checks = check_findings(baseline), check_findings(current)
    for key, count in new_checks.items():
        if key in old_checks and count > old_checks[key]:
            out.append(f"{key}: aliasing findings {old_checks[key]} -> {count}")
    return out


def _case_label(case: dict) -> str:
    from ..cases import Case

    return Case(**case).label
