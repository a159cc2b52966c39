"""``python -m oracle.report``: its outputs, the gate's exit codes, atomic baselines, crash isolation.

Each test runs the real command on a slice of the grid (--ops/--dtypes) to stay quick: its ``main``
in-process, whose workers are processes as always.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from oracle.environment import platform_key, write_json_atomic
from oracle.report.results import SCHEMA
from tests.conftest import refuse_the_sweep

SLICE = ["--ops", "rms_norm", "--dtypes", "float32", "--variants", "llama", "--no-checks", "--workers", "2"]


@pytest.fixture
def report(report_main, tmp_path):
    """The command's ``main`` in-process, writing run.json and run.html in the test's folder: its
    workers are processes all the same (a crash kills one), and the parent's start-up is saved."""
    return lambda *args: report_main("--json", tmp_path / "run.json", "--html", tmp_path / "run.html", *args)


@pytest.fixture(scope="module")
def baseline(small_report) -> Path:
    """A baseline of the unchanged kernels on this slice, written with --update-baseline."""
    return Path(small_report["baseline"])


def test_outputs_table_json_and_html(baseline, small_report):
    assert "kernel-oracle drift: kernels on" in small_report["stdout"]  # the terminal table
    document = json.loads(Path(small_report["json"]).read_text())
    assert document["schema"] == SCHEMA and document["impl"] == "kernels" and document["sweep"] == "quick"
    assert document["environment"]["platform"] == platform_key()
    assert {"torch", "triton", "transformers", "commit", "device"} <= document["environment"].keys()
    assert document["cells"] and all(c["status"] == "pass" for c in document["cells"])
    assert {c["tensor"] for c in document["cells"]} == {"Y", "dX", "dW"}
    cell = document["cells"][0]
    assert {"error_ratio", "bit_identical", "ulp_max", "ulp_p99", "ulp_mean", "max_abs", "max_rel",
            "nonfinite_mismatches"} <= cell["metrics"].keys()
    html = (baseline.parent / "drift.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "data:image/svg+xml;base64," in html and "<script" not in html


@pytest.mark.parametrize("loop, verdict", [(0.71, "bad"), (0.69, "good")])
def test_the_dashboard_shows_wall_per_call_beside_gpu_time(small_report, loop, verdict):
    """The performance section's loop columns and the wall targets' cell, against compile's loop (0.70)."""
    import re
    from dataclasses import asdict

    from oracle.bench import targets
    from oracle.report import html
    from tests.test_bench import COPY_TBPS, _workload

    timings = _workload(loop=loop)
    bench = {"environment": {"device": "a stub GPU"}, "copy_tbps": COPY_TBPS,
             "timings": [asdict(t) for t in timings], "targets": targets(timings, COPY_TBPS)}
    page = html.render(json.loads(Path(small_report["json"]).read_text()), None, bench)
    assert "fwd ms (loop)" in page and "fwd+bwd ms (loop)" in page and "loop ms vs compile" in page
    assert re.search(rf'class="{verdict}">[^<]*; *\n?{loop:.3f} vs 0\.700</td>', page), page[-3000:]
    assert 'alt="GPU time and wall per call relative to torch.compile"' in page


def test_the_performance_figure_draws_wall_per_call_over_compiles():
    """The figure's second row: each implementation's loop time over compile's, bar by bar."""
    from dataclasses import asdict

    import matplotlib.pyplot as plt

    from oracle.report import html
    from tests.test_bench import _workload

    timings = [asdict(t) for t in _workload(loop=0.63)]
    keys = sorted({(t["op"], t["variant"], t["dtype"]) for t in timings})
    fig, ax = plt.subplots()
    html._ratio_bars(ax, timings, keys, ["kernels", "compile", "liger", "eager"], "fwd_bwd_loop_ms")
    plt.close(fig)
    heights = [round(bar.get_height(), 3) for bar in ax.patches]
    assert heights == [round(0.63 / 0.70, 3), 1.0, round(0.80 / 0.70, 3), round(2.7 / 0.70, 3)]


def test_unchanged_kernels_pass_the_gate(small_rerun, baseline):
    """A second real sweep of the slice (the session's rerun, tests/conftest.py) gated against the
    first run's baseline: every cell judged, none regressed."""
    assert small_rerun["returncode"] == 0, small_rerun["stdout"] + small_rerun["stderr"]
    cells = len(json.loads(baseline.read_text())["cells"])
    assert small_rerun["stdout"].strip().splitlines()[-1] == \
        f"gate: {cells} cells judged, 0 regressions; 0 baseline cells not judged; 0 new cells"


def test_one_extra_rounding_step_fails_the_gate_and_shows_where(tmp_path, baseline, report):
    code, out, err = report(*SLICE, "--workers", "1", "--gate", "--baseline", str(baseline), "--impl",
                            "tests.broken_impls:extra_rounding")
    assert code == 1, out + err
    assert "regression(s) against the baseline" in out
    document = json.loads((tmp_path / "run.json").read_text())
    regressed = {d["key"] for d in document["baseline"]["deltas"] if d["regression"]}
    # Y is rounded through bf16, and so is the gradient flowing back through that cast.
    assert {key.rsplit("/", 1)[1] for key in regressed} == {"Y", "dX", "dW"}
    html = (tmp_path / "run.html").read_text()
    assert 'class="regression"' in html and next(iter(regressed)) in html


@pytest.fixture
def main_before_sweep(report_main_before_sweep, tmp_path):
    """The command's ``main`` in-process on the run's own paths, its sweep patched to fail."""
    return lambda *args: report_main_before_sweep("--json", tmp_path / "run.json", "--html", tmp_path / "run.html",
                                                  *args)


def test_gate_usage_errors_exit_2(tmp_path, baseline, main_before_sweep):
    code, out, _ = main_before_sweep(*SLICE, "--gate", "--baseline", str(tmp_path / "absent.json"))
    assert code == 2 and "no baseline at" in out, out
    (tmp_path / "broken.json").write_text("{not json")
    code, out, _ = main_before_sweep(*SLICE, "--gate", "--baseline", str(tmp_path / "broken.json"))
    assert code == 2 and "not readable JSON" in out, out
    other = json.loads(baseline.read_text())
    other["environment"]["platform"] = "cuda-Some-Other-GPU"
    (tmp_path / "other.json").write_text(json.dumps(other))
    code, out, _ = main_before_sweep(*SLICE, "--gate", "--baseline", str(tmp_path / "other.json"))
    assert code == 2 and "was made on 'cuda-Some-Other-GPU'" in out, out
    code, _, err = main_before_sweep("--ops", "gelu")
    assert code == 2 and "invalid choice" in err, err
    assert not (tmp_path / "run.json").exists()  # refused before the sweep, nothing written


def test_a_crash_loses_only_its_case(tmp_path, report):
    """One worker: its death and replacement are the crash's whole cost, and the cases after it run."""
    code, out, err = report(*SLICE, "--workers", "1", "--impl", "tests.broken_impls:crashes_on_the_widest_rows")
    assert code == 0, out + err
    document = json.loads((tmp_path / "run.json").read_text())
    statuses = [c["status"] for c in document["cases"]]
    wide = [c for c in document["cases"] if c["case"]["dims"]["cols"] > 4097]
    assert wide and all(c["status"] == "crash" for c in wide)
    assert statuses.count("pass") == len(statuses) - len(wide)
    crash = wide[0]
    assert "exit code" in crash["error"] and crash["repro"].startswith("python -m oracle.repro")


def test_baseline_writes_are_atomic(tmp_path, monkeypatch):
    target = tmp_path / "baseline.json"
    write_json_atomic(target, {"schema": SCHEMA, "n": 1})

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(json, "dumps", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_json_atomic(target, {"schema": SCHEMA, "n": 2})
    assert json.loads(target.read_text()) == {"schema": SCHEMA, "n": 1}
    assert os.listdir(tmp_path) == ["baseline.json"]  # no half-written temporary left behind


def test_ops_an_implementation_declares_lacking_are_listed_not_swept(tmp_path, report, monkeypatch):
    """As in pytest: a declared lack is named with its reason, never swept (it used to fill the
    table with 0/N rows and the aliasing checks with "'NoneType' object is not callable"); asking
    for it with --ops is a usage error."""
    partial = "tests.broken_impls:declares_what_it_lacks"  # rope only
    code, out, err = report("--impl", partial, "--dtypes", "float32", "--variants", "plain", "--workers", "1")
    assert code == 0, out + err
    document = json.loads((tmp_path / "run.json").read_text())
    assert {c["op"] for c in document["cells"]} == {"rope"} and {c["op"] for c in document["aliasing"]} == {"rope"}
    assert all(c["status"] == "pass" for c in document["cells"]) and not document["failures"]
    assert document["not_tested"]["rms_norm"] == "not written yet"
    assert f"not tested: rms_norm: {partial} declares it lacks it (not written yet)" in out
    assert "not written yet" in (tmp_path / "run.html").read_text()

    refuse_the_sweep(monkeypatch)  # as main_before_sweep does, after the real sweep above
    code, out, err = report("--impl", partial, "--ops", "rms_norm")
    assert code == 2 and "declares it lacks rms_norm" in out, out + err


@pytest.mark.parametrize("workers", ["0", "-2", "two"])
def test_workers_must_be_a_positive_count(workers):
    from oracle.report.__main__ import parse

    with pytest.raises(SystemExit) as exit_:
        parse(["--workers", workers])
    assert exit_.value.code == 2
    assert parse(["--workers", "3"]).workers == 3
