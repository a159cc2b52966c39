"""The regression gate: baselines validated before the sweep, a gate that cannot pass by judging
nothing, a last line that says what went unjudged, and baselines that diff cleanly.

Most tests run ``main`` in-process with the sweep patched out (a bad baseline must be refused before
it starts) or on a stored run (``--from-json``); two run the real command on a slice of the grid.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import re
from pathlib import Path

import pytest

from oracle.environment import platform_key
from oracle.report import gate, results
from oracle.report.results import SCHEMA

ROOT = Path(__file__).parent.parent
COMMITTED = {"cpu-interpreter": ROOT / "reports/baseline-cpu-interpreter.json",
             "cuda-NVIDIA-H200": ROOT / "reports/baseline-cuda-NVIDIA-H200.json"}
SLICE = ["--ops", "rms_norm", "--dtypes", "float32", "--variants", "llama", "--no-checks", "--workers", "2"]
VERDICT = re.compile(r"gate: (\d+) cells judged, (\d+) regressions?(?:, \d+ changed within (?:its verdict|their "
                     r"verdicts) \(drift\))?; (\d+) baseline cells not judged(.*?); (\d+) new cells?(?: \(.*?\))?"
                     r"(?:; sizes judged: [^(]*)?( \(changed error ratios and bit-identities partly HF's own: .*\))?$")


def volatile_fields(value, path: str = "") -> list[str]:
    """Where timings or timestamps hide in a document, at any depth."""
    if isinstance(value, dict):
        return [f"{path}/{name}" for name in value if name in results.VOLATILE_FIELDS] + \
            [hit for name, inner in value.items() for hit in volatile_fields(inner, f"{path}/{name}")]
    if isinstance(value, list):
        return [hit for inner in value for hit in volatile_fields(inner, f"{path}[]")]
    return []


def last_line(output: str) -> str:
    return output.strip().splitlines()[-1]


# --- the committed baselines -------------------------------------------------------------------------

@pytest.mark.parametrize("platform", sorted(COMMITTED))
def test_committed_baselines_are_valid_and_in_stable_form(platform):
    path = COMMITTED[platform]
    document = gate.load_baseline(path, platform)  # raises BaselineError on the first problem
    assert document["schema"] == SCHEMA and document["environment"]["platform"] == platform
    assert not volatile_fields(document)
    # exactly what --update-baseline writes: sorted keys, indent 1, cells and cases in a fixed order
    assert path.read_text() == json.dumps(results.baseline_view(document), indent=1, sort_keys=True) + "\n"


@pytest.mark.skipif(platform_key() != "cpu-interpreter", reason="the committed CPU baseline is for the interpreter")
def test_current_kernels_pass_the_committed_cpu_baseline(tmp_path, small_rerun, report_main):
    """A real sweep of the current kernels on the slice (the session's rerun, tests/conftest.py),
    gated against the committed baseline: what the sweep made, judged as ``--gate`` judges it."""
    assert small_rerun["returncode"] == 0, small_rerun["stdout"] + small_rerun["stderr"]
    code, out, _ = report_main("--from-json", small_rerun["json"], *SLICE, "--gate", "--baseline",
                               COMMITTED["cpu-interpreter"], "--html", tmp_path / "run.html")
    assert code == 0, out
    judged, regressions, unjudged, why, new, _ = VERDICT.match(last_line(out)).groups()
    baseline_cells = len(json.loads(COMMITTED["cpu-interpreter"].read_text())["cells"])
    assert int(judged) > 0 and regressions == "0" and new == "0"
    assert int(judged) + int(unjudged) == baseline_cells
    assert why == f" ({unjudged} filtered out by --ops/--dtypes/--variants)"


# --- a baseline the gate cannot use: exit 2, one sentence, before the sweep ----------------------------

@pytest.fixture(scope="module")
def committed_cpu_baseline() -> dict:
    """The committed CPU baseline, relabelled as this machine's (only its structure matters here)."""
    document = json.loads(COMMITTED["cpu-interpreter"].read_text())
    document["environment"]["platform"] = platform_key()
    return document


@pytest.fixture
def gate_before_sweep(report_main_before_sweep, tmp_path, committed_cpu_baseline):
    """``main --gate`` on the slice against a spoilt copy of the baseline; the sweep must not start."""
    def run(spoil) -> tuple[int, str]:
        document = copy.deepcopy(committed_cpu_baseline)
        spoil(document)
        path = tmp_path / "baseline.json"
        path.write_text(json.dumps(document))
        code, out, _ = report_main_before_sweep(*SLICE, "--gate", "--baseline", path, "--json", tmp_path / "run.json",
                                                "--html", tmp_path / "run.html")
        return code, out

    return run


def _empty(document):
    document["cells"], document["cases"], document["aliasing"] = [], [], []


def _renamed(document):
    for cell in document["cells"]:
        cell["key"] = "v2/" + cell["key"]


def _first_metrics(document) -> dict:
    return document["cells"][0]["metrics"]


def _other_platform(document):
    document["environment"]["platform"] = "cuda-Some-Other-GPU"


SPOILT = {
    "empty": (_empty, "it has no cells, so it could judge nothing"),
    "renamed keys": (_renamed, "no cell of this run is in the baseline"),
    "missing metric": (lambda d: _first_metrics(d).pop("nonfinite_mismatches"), "has no nonfinite_mismatches"),
    "NaN ratio": (lambda d: _first_metrics(d).update(error_ratio=math.nan), "has a non-finite error_ratio (nan)"),
    "metrics null": (lambda d: d["cells"][0].update(metrics=None), "has status pass but no metrics"),
    "ratio a string": (lambda d: _first_metrics(d).update(error_ratio="1.0"), "error_ratio that is not a number"),
    "unknown status": (lambda d: d["cells"][0].update(status="passed"), "unknown status 'passed'"),
    "duplicate cell": (lambda d: d["cells"].append(d["cells"][0]), "appears twice"),
    "malformed case": (lambda d: d["cases"][0].update(case={"op": "rms_norm"}), "case #0 has no valid case"),
    "malformed check": (lambda d: d["aliasing"][0].pop("check"), "aliasing check #0 lacks"),
    "old schema": (lambda d: d.update(schema="kernel-oracle/drift/1"), "its schema is 'kernel-oracle/drift/1'"),
    "other platform": (_other_platform, "it was made on 'cuda-Some-Other-GPU'"),
    "other noise model": (lambda d: d["environment"].update(noise_model="declared"),
                          "judged by the declared noise model, this run's by the derived one"),
}


@pytest.mark.parametrize("name", SPOILT)
def test_an_unusable_baseline_exits_2_in_one_sentence_before_the_sweep(gate_before_sweep, name):
    spoil, expected = SPOILT[name]
    code, out = gate_before_sweep(spoil)
    assert code == 2, out
    assert len(out.strip().splitlines()) == 1 and out.startswith("error: ") and "Traceback" not in out, out
    assert "baseline.json" in out and expected in out, out


# --- judging a stored run (--from-json: no sweep) ------------------------------------------------------

@pytest.fixture
def gate_stored_run(tmp_path, small_report, report_main):
    """``main --gate`` on the small report's run (or a changed copy) against its baseline (or a changed copy)."""
    def gate_it(baseline: dict | None = None, run: dict | None = None) -> tuple[int, str]:
        run_path, baseline_path = Path(small_report["json"]), Path(small_report["baseline"])
        if run is not None:
            run_path = tmp_path / "run.json"
            run_path.write_text(json.dumps(run))
        if baseline is not None:
            baseline_path = tmp_path / "baseline.json"
            baseline_path.write_text(json.dumps(baseline))
        code, out, _ = report_main("--from-json", run_path, "--gate", "--baseline", baseline_path,
                                   "--html", tmp_path / "run.html")
        return code, out

    return gate_it


def test_a_clean_run_passes_and_says_everything_was_judged(tmp_path, small_report, gate_stored_run):
    code, out = gate_stored_run()
    cells = len(json.loads(Path(small_report["baseline"]).read_text())["cells"])
    assert code == 0, out
    assert last_line(out) == f"gate: {cells} cells judged, 0 regressions; 0 baseline cells not judged; 0 new cells"


def _loaded(path: str) -> dict:
    return json.loads(Path(path).read_text())


def test_a_grown_error_ratio_alone_is_drift_reported_with_its_ratios(tmp_path, small_report, gate_stored_run):
    """Note [Drift or regression]: the error ratio and bit-identity to HF measure the distance to
    HF's bits; a cell that passes before and after, its typical error inside the room, has drifted."""
    baseline = _loaded(small_report["baseline"])
    cell = max(baseline["cells"], key=lambda c: c["metrics"]["error_ratio"])
    cell["metrics"]["error_ratio"], cell["metrics"]["bit_identical"] = 0.0, 1.0  # as if exact and HF's bits before
    code, out = gate_stored_run(baseline=baseline)
    assert code == 0, out
    assert f"{cell['key']}: changed within its verdict: error ratio 0 ->" in out
    assert ", 1 changed within its verdict (drift);" in last_line(out) and VERDICT.match(last_line(out)), out


def test_a_typical_error_grown_beyond_the_room_of_a_valid_evaluation_exits_1(tmp_path, small_report, gate_stored_run):
    run = _loaded(small_report["json"])
    cell = max(run["cells"], key=lambda c: c["metrics"]["mean_error"])
    metrics = cell["metrics"]
    metrics["mean_error"] += 1.01 * gate.typical_room(metrics) + 1e-6
    code, out = gate_stored_run(run=run)
    assert code == 1, out
    assert f"{cell['key']}: precision lost: typical error" in out and "a valid evaluation may add" in out, out
    assert VERDICT.match(last_line(out)).group(2) == "1"


def _from_another_host(document: dict) -> dict:
    """The same document as if made where torch's vector maths rounds otherwise."""
    other = copy.deepcopy(document)
    other["environment"]["host_maths"] = {**other["environment"]["host_maths"], "cpu_capability": "AVX2",
                                          "digest": "0" * 16}
    return other


def test_against_another_hosts_maths_the_verdict_is_the_same(tmp_path, small_report, gate_stored_run):
    """environment.py, Note [Host maths]: no rule reads HF's bits, so a baseline from a host whose HF
    rounds otherwise gives the same verdicts, and the last line says that the drift it lists is
    partly HF's: a moved ratio is drift, a pass turned fail and lost precision regress, on both."""
    for spoil in (lambda d: d, _from_another_host):
        baseline = spoil(_loaded(small_report["baseline"]))
        cell = max(baseline["cells"], key=lambda c: c["metrics"]["error_ratio"])
        cell["metrics"]["error_ratio"], cell["metrics"]["bit_identical"] = 0.0, 1.0
        code, out = gate_stored_run(baseline=baseline)
        assert code == 0 and VERDICT.match(last_line(out)).group(2) == "0", out
        assert (spoil is _from_another_host) == ("HF's maths rounds otherwise here (torch" in last_line(out)), out
        run = _loaded(small_report["json"])
        run["cells"][0]["status"] = "fail"
        code, out = gate_stored_run(run=run, baseline=baseline)
        assert code == 1 and f"{run['cells'][0]['key']}: passed before, now fail" in out, out
        run = _loaded(small_report["json"])
        metrics = run["cells"][1]["metrics"]
        metrics["mean_error"] += 2 * gate.typical_room(metrics) + 0.01
        code, out = gate_stored_run(run=run, baseline=baseline)
        assert code == 1 and f"{run['cells'][1]['key']}: precision lost" in out, out


def _verdict(metrics: dict, **changes) -> dict:
    return {**metrics, **changes}


def test_precision_lost_separates_another_order_from_partials_rounded_to_16_bits():
    """The two rules on numbers measured (tests/test_gate_own_op.py's kernel, RMSNorm's dW below):
    another evaluation order moves the typical error by a fraction of rule 1's room; partial sums
    rounded to bf16 by more than it, or (a loose hand-written model) by more than half a bit; a
    scalar (one element) may move by far more, by chance, and does not regress."""
    fp32_dX = {"mean_error": 0.1142, "mean_bound": 0.3338, "hf_mean_error": 0.1142, "reordered_mean_error": 0.1142,
               "shape": [24, 1000]}
    assert gate.precision_lost(_verdict(fp32_dX, mean_error=0.1269), fp32_dX) is None  # reassociated
    bf16_dgamma = {"mean_error": 0.0856, "mean_bound": 0.1221, "hf_mean_error": 0.0856,
                   "reordered_mean_error": 0.0856, "shape": [1000]}
    lost = gate.precision_lost(_verdict(bf16_dgamma, mean_error=0.1492), bf16_dgamma)
    assert lost and "more than the 0.0365 a valid evaluation may add" in lost, lost
    loose_dW = {"mean_error": 0.0055, "mean_bound": 0.0783, "hf_mean_error": 0.0055, "reordered_mean_error": 0.0055,
                "shape": [256]}
    lost = gate.precision_lost(_verdict(loose_dW, mean_error=0.0437), loose_dW)
    assert lost and "more than half a bit beyond sampling noise" in lost, lost
    scalar = {"mean_error": 0.0025, "mean_bound": 1.5, "hf_mean_error": 0.0025, "reordered_mean_error": 0.0025,
              "shape": [1]}
    assert gate.precision_lost(_verdict(scalar, mean_error=0.064), scalar) is None


def test_the_gate_still_sees_bf16_partial_sums_that_pass_the_verdict(device, monkeypatch):
    """Liger-Kernel #950's kind (tests/broken_impls.py): dW's partial sums added in bfloat16 past a
    row count. The derived noise model (the default) fails it on the case alone. RMSNorm's
    hand-written noise model (``declared``) lets it through the verdict; the gate, against the
    kernels' own cell, still regresses it (precision lost), and the kernels against themselves do not."""
    from types import SimpleNamespace

    from oracle.cases import Case
    from oracle.engine import run_case
    from oracle.declare.implementations import Implementation, load
    from tests import broken_impls

    # 1024 rows past 64, in tiles of 16: 64 partial sums rounded to bf16 (measured: dW's typical error
    # 0.0111 -> 0.0418, 3.8x against the 2.0x the rule allows; 4096 rows, 0.0055 -> 0.0437 as in
    # test_precision_lost_separates_another_order_from_partials_rounded_to_16_bits, cost three times as much)
    broken = Implementation("bf16 partials", SimpleNamespace(rms_norm=broken_impls.rms_norm_bf16_partials_past(64, 16)))
    case = Case("rms_norm", "llama", "bfloat16", {"lead": [1024], "cols": 256}, "contiguous", "normal",
                {"eps": 1e-6, "weight": "same"}, seed=3)

    def dW(impl, passes: bool = True) -> dict:
        result = run_case("rms_norm", case, impl, device)
        verdict = next(v for v in result.verdicts if v.name == "dW")
        assert verdict.passed == passes, result.explain()
        return {"status": "pass", "metrics": verdict.to_dict()}

    monkeypatch.delenv("ORACLE_NOISE_MODEL", raising=False)  # the default: derived
    dW(broken, passes=False)
    monkeypatch.setenv("ORACLE_NOISE_MODEL", "declared")  # the hand-written model: the gate's premise
    kernels, bf16 = dW(load("kernels")), dW(broken)
    assert gate._cell_regressions(kernels, kernels) == []
    regressions = gate._cell_regressions(bf16, kernels)
    assert any(r.startswith("precision lost: typical error") for r in regressions), regressions


def test_a_pass_turned_fail_exits_1(tmp_path, small_report, gate_stored_run):
    run = _loaded(small_report["json"])
    run["cells"][0]["status"] = "fail"
    code, out = gate_stored_run(run=run)
    assert code == 1 and f"{run['cells'][0]['key']}: passed before, now fail" in out, out


def test_a_run_cell_without_a_finite_ratio_regresses(tmp_path, small_report, gate_stored_run):
    run = _loaded(small_report["json"])
    run["cells"][0]["metrics"]["error_ratio"] = math.nan  # NaN > bound is False: it used to pass
    code, out = gate_stored_run(run=run)
    assert code == 1, out
    assert re.search(rf"{re.escape(run['cells'][0]['key'])}: error_ratio \S+ -> nan", out), out
    del run["cells"][1]["metrics"]["bit_identical"]  # a stored run of an older schema: no KeyError
    regressions = gate.compare(run, _loaded(small_report["baseline"]))["regressions"]
    assert any(r.startswith(f"{run['cells'][1]['key']}: bit_identical") for r in regressions)


def test_a_new_finding_in_a_case_regresses_whatever_the_order_of_its_dims(small_report):
    """A run's cases come from the sweep, the baseline's from a file with sorted keys: the labels of
    the same case differ (Case.label follows the order of dims), so cases match on their description."""
    baseline, run = _loaded(small_report["baseline"]), _loaded(small_report["json"])
    for record in run["cases"]:
        record["case"]["dims"] = dict(reversed(record["case"]["dims"].items()))  # the sweep's order
    run["cases"][0]["findings"].append({"check": "unwritten", "tensor": "Y", "phase": "forward", "message": "..."})
    comparison = gate.compare(run, baseline)
    assert comparison["regressions"] == [f"{gate._case_label(run['cases'][0]['case'])}: new finding of the unwritten "
                                         "check on Y: ..."]


def test_a_new_aliasing_finding_says_which_check_found_what(small_report):
    """Not "aliasing findings 0 -> 1": the check, the tensor and the finding's own words."""
    baseline, run = _loaded(small_report["baseline"]), _loaded(small_report["json"])
    check = run["aliasing"][0]
    check["findings"].append({"check": check["check"], "tensor": "dW", "phase": "backward",
                              "message": "differs from the first run's bits at [3]\nmore lines"})
    regressions = gate.compare(run, baseline)["regressions"]
    assert regressions == [f"{check['op']}/{check['dtype']}/{check['check']}: the {check['check']} check reports 1 "
                           f"finding (the baseline 0), first dW: differs from the first run's bits at [3]"], regressions


# --- why cells went unjudged --------------------------------------------------------------------------

def test_unjudged_cells_are_counted_with_their_reason(small_report, committed_cpu_baseline):
    run = _loaded(small_report["json"])
    judged = len(run["cells"])
    others = len(committed_cpu_baseline["cells"]) - judged
    sliced = gate.Selection(ops=("rms_norm",), dtypes=("float32",), variants=("llama",))
    comparison = gate.compare(run, committed_cpu_baseline, sliced)
    assert comparison["judged"] == judged
    assert comparison["not_judged"] == {"filtered out by --ops/--dtypes/--variants": others}
    unfiltered = gate.compare(run, committed_cpu_baseline)
    assert unfiltered["not_judged"] == {"not in this run (renamed, or dropped from the grid)": others}
    full = gate.compare(run, {**committed_cpu_baseline, "sweep": "full"}, gate.Selection(ops=("rms_norm",)))
    assert full["not_judged"] == {"filtered out by --ops": len([c for c in committed_cpu_baseline["cells"]
                                                               if c["op"] != "rms_norm"]),
                                  "not in the quick grid of this run (the baseline's is full)":
                                      len([c for c in committed_cpu_baseline["cells"] if c["op"] == "rms_norm"])
                                      - judged}


def test_an_op_another_implementation_lacks_is_not_judged_but_the_same_one_losing_it_regresses(small_report):
    baseline, run = _loaded(small_report["baseline"]), _loaded(small_report["json"])
    for cell in run["cells"]:
        cell["status"], cell["metrics"] = "skipped", None
    other = gate.compare({**run, "impl": "liger"}, baseline)
    assert other["judged"] == 0 and other["regressions"] == []
    assert other["not_judged"] == {"op missing from the implementation": len(run["cells"])}
    same = gate.compare(run, baseline)
    assert same["judged"] == len(run["cells"]) and all("now skipped" in r for r in same["regressions"])


def _with_another_op(run: dict) -> dict:
    """The run as if it also swept an op the baseline never had."""
    other = copy.deepcopy(run)
    extra = [{**cell, "op": "other_op", "key": "other_op/" + cell["key"].split("/", 1)[1]} for cell in run["cells"]]
    other["cells"] += extra
    return other


def test_an_op_absent_from_the_baseline_is_named_and_exits_2(tmp_path, small_report, gate_stored_run):
    run = _with_another_op(_loaded(small_report["json"]))
    comparison = gate.compare(run, _loaded(small_report["baseline"]))
    n = len(run["cells"]) // 2
    assert comparison["new"] == {"of op other_op, absent from the baseline": n}
    assert gate.unasked(comparison) == [f"{n} cells of this run of op other_op, absent from the baseline"]
    code, out = gate_stored_run(run=run)
    assert code == 2, out
    assert "error: the gate never passes what it did not judge: " in out and "of op other_op, absent from the " \
        "baseline" in out, out


def test_a_quick_run_against_a_full_baseline_exits_2_naming_what_it_lacks(tmp_path, small_report, gate_stored_run):
    """The cells the quick grid has not are named (before, they were counted and the gate passed)."""
    baseline = _loaded(small_report["baseline"])
    extra = copy.deepcopy(baseline["cells"][0])
    extra["key"] = extra["key"].replace(extra["label"], extra["label"] + "-wider")
    baseline["cells"].append(extra)
    baseline["sweep"] = "full"
    code, out = gate_stored_run(baseline=baseline)
    assert code == 2, out
    assert "1 baseline cell not in the quick grid of this run (the baseline's is full)" in out, out
    quick_keys = results.cell_keys([])  # an empty plan: the before-the-sweep check names every cell
    problem = gate.coverage_problem(quick_keys | {(c["key"], c["identity"]) for c in baseline["cells"][:-1]},
                                    {"rms_norm"}, baseline, gate.Selection(), "quick", None, Path("b.json"))
    assert problem and "1 baseline cell not in the quick grid of this run (the baseline's is full)" in problem
    sliced = gate.coverage_problem(set(), {"rms_norm"}, baseline, gate.Selection(ops=("rope",)), "quick", None,
                                   Path("b.json"))
    assert sliced is None  # a slice asked for with --ops is judged as a slice


def test_the_last_line_names_every_reason():
    comparison = {"judged": 33, "regressions": ["x"], "new_cells": ["a", "b"],
                  "not_judged": {"filtered out by --ops/--dtypes": 390, "op missing from the implementation": 2}}
    assert gate.verdict_line(comparison) == ("gate: 33 cells judged, 1 regression; 392 baseline cells not judged "
                                             "(390 filtered out by --ops/--dtypes, 2 op missing from the "
                                             "implementation); 2 new cells")


# --- baselines that diff cleanly ---------------------------------------------------------------------

def without_commit(text: bytes) -> bytes:
    """The harness's commit taken out (environment.commit and environment.harness.commit)."""
    return re.sub(rb'\n +"commit": "[^"\n]*",\n', b"\n", text)


def test_updating_a_baseline_twice_gives_the_same_bytes(small_report, small_rerun):
    """The session's rerun (tests/conftest.py) replaced a copy of the small report's baseline (and
    compared with it) with its own."""
    assert small_rerun["returncode"] == 0, small_rerun["stdout"] + small_rerun["stderr"]
    first, second = Path(small_report["baseline"]), Path(small_rerun["baseline"])
    assert "baseline updated:" in small_rerun["stdout"], small_rerun["stdout"]
    # byte for byte, but for the harness's commit: the checkout may have moved between the two runs
    a, b = without_commit(first.read_bytes()), without_commit(second.read_bytes())
    assert a == b, "".join(list(difflib.unified_diff(a.decode().splitlines(True), b.decode().splitlines(True), n=2))[:40])
    assert not volatile_fields(json.loads(first.read_text()))
    assert "seconds" in json.loads(Path(small_rerun["json"]).read_text())  # the full report keeps its timings


def test_baseline_view_drops_only_volatile_fields(small_report):
    run = _loaded(small_report["json"])
    view = results.baseline_view(run)
    assert set(run) - set(view) == {"created", "seconds"}
    assert [c["key"] for c in view["cells"]] == sorted(c["key"] for c in run["cells"])
    assert sorted(map(json.dumps, view["cells"])) == sorted(map(json.dumps, run["cells"]))
    assert len(view["cases"]) == len(run["cases"]) and not volatile_fields(view)


def test_a_quick_run_against_a_full_baseline_judges_only_the_same_data(tmp_path, small_report, gate_stored_run):
    """The quick and the full grid give some labels to other data (RMSNorm's zero-row case: the same
    shape, another seed). A baseline of the full grid's cells under those labels, made for real, shares
    no data with the quick run: every such cell is not judged, with the reason, none regresses, and
    the gate exits 2 because it could judge nothing."""
    from oracle.environment import environment
    from oracle.report import sweep

    quick = _loaded(small_report["json"])
    labels = {cell["label"] for cell in quick["cells"]}
    full = [t for t in sweep.plan(True, ["rms_norm"], ["float32"], ["llama"], checks=False) if t.case.label in labels]
    assert full, "the grids share no label: nothing to test"
    answers = sweep.run(full, "kernels", [None])
    baseline = results.baseline_view(results.build(full, answers, "kernels", "full", environment(), 0.0))
    comparison = gate.compare(quick, baseline)
    shared = [c for c in quick["cells"] if c["key"] in {b["key"] for b in baseline["cells"]}]
    assert shared and comparison["regressions"] == [] and comparison["judged"] == 0
    assert comparison["not_judged"]["other data under the same label (another seed or case)"] == len(shared)
    code, out = gate_stored_run(baseline=baseline)
    assert code == 2 and "could judge nothing" in out, out
