"""Kernel coverage where a user looks (oracle/kernel_coverage/, docs/design.md §9): pytest's summary
per op, and the report's JSON, terminal and dashboard; with a kernel written for the purpose
(tests/coverage_demo.py) whose constexpr branch the launches never reach, and a twin whose launches
reach it. Then the pieces alone: merging, blocks of unreached lines, the summary's text, and the bad
paths (a kernel without source, Triton not loaded, coverage switched off, a kernel file gone)."""

from __future__ import annotations

import ast
import contextlib
import copy
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from oracle import kernel_coverage
from oracle.kernel_coverage import collect, summary
from oracle.kernel_coverage.source import conditions_over, kernel_source
from tests.conftest import ROOT, once_per_session

DEMO = ROOT / "tests" / "coverage_demo.py"
OP = "coverage_demo"
KEY = "tests/coverage_demo.py:_double"  # how a summary names the demo's kernel, run from the checkout


def _demo_kernel() -> dict:
    """The demo kernel as its file holds it, read here without the code under test: its ``def``
    line, its statements, and the line of the body of ``if FLAG:``."""
    tree = ast.parse(DEMO.read_text())
    kernel = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_double")
    branch = next(n for n in ast.walk(kernel) if isinstance(n, ast.If))
    assert ast.unparse(branch.test) == "FLAG"
    statements = {n.lineno for n in ast.walk(kernel) if isinstance(n, ast.stmt) and n is not kernel}
    return {"first_line": kernel.lineno, "statements": statements, "flag_body": branch.body[0].lineno}


def _python_runs(runs: dict[str, list], env: dict, timeout: int = 600) -> dict[str, dict]:
    """Several ``python ARGS`` at once from the checkout (name -> arguments): exit status and output."""
    started = {name: subprocess.Popen([sys.executable, *map(str, args)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
               for name, args in runs.items()}
    done = {}
    for name, proc in started.items():
        out, err = proc.communicate(timeout=timeout)
        done[name] = {"code": proc.returncode, "out": out, "err": err}
    return done


@pytest.fixture(scope="session")
def demo_runs(tmp_path_factory) -> dict:
    """The demo op through the generic suite under xdist (``never``: FLAG never set), in one process
    (``sometimes``: the twin sets it for odd widths), and through the report (FLAG never set); at
    once, once per session. The suite runs float32's differential test only, in CI's profile."""
    def make(folder: Path) -> dict:
        # Lines are traced where the kernel's Python body runs: under the interpreter, on a GPU machine too.
        env = {**os.environ, "HYPOTHESIS_PROFILE": "ci", "TRITON_INTERPRET": "1",
               "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
        env.pop("ORACLE_KERNEL_COVERAGE", None)
        suite = ["-m", "pytest", "-p", "no:cacheprovider", "--pyargs", "oracle.suite", "--op-module", "coverage_demo",
                 "--ops", OP, "-k", "matches_hf and float32"]
        paths = {"json": folder / "drift.json", "html": folder / "drift.html"}
        runs = _python_runs({
            "never": [*suite, "--impl", "coverage_demo:impl", "-n", "2"],
            "sometimes": [*suite, "--impl", "coverage_demo:flagged"],
            "report": ["-m", "oracle.report", "--op-module", "coverage_demo", "--impl", "coverage_demo:impl",
                       "--ops", OP, "--no-checks", "--workers", "1", "--json", paths["json"], "--html", paths["html"]],
        }, env)
        return runs | {name: str(path) for name, path in paths.items()}

    return once_per_session(tmp_path_factory, "kernel-coverage-demo", make)


def _block(output: str, op: str) -> str:
    """The kernel coverage block of one op in a summary: its header to the next block or the end."""
    match = re.search(rf"^kernel coverage {op}:\n((?:  .*\n?)*)", output, re.MULTILINE)
    assert match, output[-3000:]
    return match.group(0)


# --- where a user looks -------------------------------------------------------------------------


def test_pytest_names_the_kernel_its_lines_and_the_branch_it_never_reached(demo_runs):
    """Under xdist: the workers' records reach the controller, which prints them."""
    run, demo = demo_runs["never"], _demo_kernel()
    assert run["code"] == 0, run["out"][-3000:] + run["err"][-2000:]
    assert "kernel-oracle: kernel coverage" in run["out"]
    block = _block(run["out"], OP)
    total = len(demo["statements"])
    assert f"{KEY}: lines {total - 1}/{total}" in block, block
    assert f"never reached: line {demo['flag_body']} (under `FLAG`)" in block, block
    assert re.search(r"constexprs seen: BLOCK=[\d|]+, FLAG=False\n", block), block


def test_a_twin_whose_launches_set_the_flag_reaches_every_line(demo_runs):
    """Without xdist (the records of the session's own process), and the same kernel with FLAG set
    for odd widths: nothing is left unreached, so the test above can fail."""
    run, demo = demo_runs["sometimes"], _demo_kernel()
    assert run["code"] == 0, run["out"][-3000:] + run["err"][-2000:]
    block = _block(run["out"], OP)
    total = len(demo["statements"])
    assert f"{KEY}: lines {total}/{total}" in block and "never reached" not in block, block
    assert "FLAG=False|True" in block, block


def test_the_report_marks_the_unreached_line_in_its_json_terminal_and_dashboard(demo_runs):
    run, demo = demo_runs["report"], _demo_kernel()
    assert run["code"] == 0, run["out"][-3000:] + run["err"][-2000:]
    assert f"never reached: line {demo['flag_body']} (under `FLAG`)" in run["out"]
    document = json.loads(Path(demo_runs["json"]).read_text())
    (key,) = document["kernel_coverage"][OP]
    record = document["kernel_coverage"][OP][key]
    assert key == f"{KEY}:{demo['first_line']}" and record["file"] == "tests/coverage_demo.py"
    assert record["unreached"] == [{"line": demo["flag_body"], "under": ["FLAG"]}]
    marks = {number: (mark, text) for number, mark, text in record["source"]}
    lines = DEMO.read_text().splitlines()
    assert all(marks[n][1] == lines[n - 1] for n in marks)  # the file's text, line for line
    assert marks[demo["flag_body"]][0] == "unreached"
    assert {n for n, (mark, _) in marks.items() if mark == "hit"} == demo["statements"] - {demo["flag_body"]}
    assert marks[demo["first_line"]][0] == ""  # the def line is no statement
    html = Path(demo_runs["html"]).read_text()
    assert re.search(rf'<span class="unreached">\s*{demo["flag_body"]} &cross; +y = x \+ x', html), html[-5000:]
    assert "<h2>Kernel coverage</h2>" in html and "<details class=\"kernel\" open>" in html


def test_a_stored_run_renders_again_and_a_baseline_without_the_key_gates(demo_runs, tmp_path, report_main):
    """--from-json renders the stored coverage; a baseline made before the key is still judged."""
    from oracle.report import results

    document = json.loads(Path(demo_runs["json"]).read_text())
    baseline = tmp_path / "baseline.json"
    old = results.baseline_view(document)
    del old["kernel_coverage"]
    baseline.write_text(json.dumps(old))
    html = tmp_path / "again.html"
    code, out, _ = report_main("--from-json", demo_runs["json"], "--html", html, "--gate", "--baseline", baseline)
    assert code == 0, out
    assert "kernel coverage coverage_demo:" in out and 'class="unreached"' in html.read_text()


def test_merged_shards_mark_a_line_run_by_either(demo_runs):
    """A line one shard never reached and another ran is run in the merge: marks made afresh, from
    the source text the shards stored."""
    from oracle.report import shards

    document = json.loads(Path(demo_runs["json"]).read_text())
    demo = _demo_kernel()
    first, second = copy.deepcopy(document), copy.deepcopy(document)
    for index, part in enumerate((first, second), start=1):
        part["shard"] = {"index": index, "count": 2, "tasks": 1, "planned": 2}
    for part in (first, second):
        (record,) = part["kernel_coverage"][OP].values()
        record["file"] = "moved/away.py"  # the merge reads no file
    record["hits"] = sorted(record["hits"] + [demo["flag_body"]])  # the second shard ran the branch
    merged = shards.merge([first, second], ["first.json", "second.json"])["kernel_coverage"][OP]
    (record,) = merged.values()
    assert record["unreached"] == [] and [n for n, mark, _ in record["source"] if mark == "unreached"] == []
    assert [mark for n, mark, _ in record["source"] if n == demo["flag_body"]] == ["hit"]


# --- the probes, in this process ----------------------------------------------------------------


@contextlib.contextmanager
def _own_scope(name: str):
    """Record into a scope of the test's own, removed after: the session's summary stays its own."""
    previous, collect.RECORDER.scope = collect.RECORDER.scope, name
    recorded: dict = {}
    try:
        yield recorded
    finally:
        collect.RECORDER.scope = previous
        recorded.update(kernel_coverage.RECORDER.to_json().get(name, {}))
        collect.RECORDER.records.pop(name, None)


def test_the_probes_record_lines_and_specialisations_of_a_launch():
    from oracle.interpreter import interpreted

    if not interpreted():
        pytest.skip("lines are probed under the CPU interpreter only")
    import torch

    from tests import coverage_demo

    assert kernel_coverage.install()
    demo = _demo_kernel()
    with _own_scope("test: one launch") as recorded:
        coverage_demo.doubled(flag_odd_widths=True)(torch.ones(2, 8))
    (record,) = recorded.values()
    assert record["traced"] and record["launched"]
    assert set(record["hits"]) == demo["statements"] - {demo["flag_body"]}  # 8 columns: even, FLAG off
    assert record["specialisations"] == {"BLOCK=8, FLAG=False": 1}
    with kernel_coverage.capture() as pairs, _own_scope("test: odd width"):
        coverage_demo.doubled(flag_odd_widths=True)(torch.ones(1, 7))
    assert (f"{KEY}:{demo['first_line']}", demo["flag_body"]) in pairs


# --- merging, blocks and the summary's text -----------------------------------------------------


KERNEL_FILE = '''\
def kernel(X, A: "tl.constexpr", B: "tl.constexpr"):
    x = 1
    if A:
        x = 2
        x = 3
    else:
        x = 4
    y = 5
    if B == 3:
        y = 6
    return x + y
'''


def _record(file: Path, hits, **fields) -> dict:
    return {"name": "kernel", "file": str(file), "module": "m", "first_line": 1,
            "statements": [2, 3, 4, 5, 7, 8, 9, 10, 11], "hits": list(hits), "specialisations": {}, "configs": {},
            "configs_total": None, "launched": True, "traced": True} | fields


@pytest.fixture
def kernel_file(tmp_path) -> Path:
    path = tmp_path / "kernel.py"
    path.write_text(KERNEL_FILE)
    return path


def test_merge_unions_lines_and_adds_counts_without_sharing_lists(kernel_file):
    a = {"op": {"k": _record(kernel_file, [2, 3], specialisations={"A=1": 2}, configs={"c": 1}, configs_total=2,
                             traced=False)}}
    b = {"op": {"k": _record(kernel_file, [3, 8], specialisations={"A=1": 1, "A=2": 1}, launched=False)},
         "other": {"k": _record(kernel_file, [2])}}
    merged = kernel_coverage.merge({}, a)
    kernel_coverage.merge(merged, b)
    record = merged["op"]["k"]
    assert record["hits"] == [2, 3, 8] and record["specialisations"] == {"A=1": 3, "A=2": 1}
    assert record["configs"] == {"c": 1} and record["configs_total"] == 2
    assert record["traced"] and record["launched"] and set(merged) == {"op", "other"}
    merged["other"]["k"]["hits"].append(99)
    assert b["other"]["k"]["hits"] == [2] and a["op"]["k"]["hits"] == [2, 3]


def test_autotuners_of_one_definition_count_the_union_of_their_configs():
    """A factory making one autotuned kernel per config list (tests/autotuned_impls.py): one
    definition, one record, and its configs are all the lists' configs, also over processes."""
    first, second = collect.Recorder(), collect.Recorder()
    first.config_ran(types.SimpleNamespace(fn=_record, configs=["A", "B"]), "A", 2)
    first.config_ran(types.SimpleNamespace(fn=_record, configs=["A", "C"]), "C", 2)
    second.config_ran(types.SimpleNamespace(fn=_record, configs=["A", "D"]), "D", 2)
    (record,) = first.to_json()[collect.OUTSIDE].values()
    assert record["configs_total"] == 3 and record["configs"] == {"A": 1, "C": 1}
    merged = kernel_coverage.merge(kernel_coverage.merge({}, first.to_json()), second.to_json())
    (record,) = merged[collect.OUTSIDE].values()
    assert record["configs_listed"] == ["A", "B", "C", "D"] and record["configs_total"] == 4


def test_the_harnesss_own_kernels_are_not_recorded():
    """Its interpreter probes (oracle/interpreter/) launch kernels: none is the code under test."""
    recorder = collect.Recorder()
    recorder.launched(summary.merge, ({}, {}), {})  # a function of the oracle package, with source
    recorder.config_ran(types.SimpleNamespace(fn=summary.merge, configs=["A"]), "A", 1)
    assert recorder.to_json() == {}


def test_unreached_blocks_join_neighbours_under_one_condition(kernel_file):
    record = _record(kernel_file, [2, 3, 9, 11])  # A false and B never 3, yet the else never ran either
    assert kernel_coverage.unreached(record) == [4, 5, 7, 8, 10]
    assert summary.unreached_blocks(record) == [(4, 5, ["A"]), (7, 7, ["not A"]), (8, 8, []), (10, 10, ["B == 3"])]
    assert kernel_coverage.ranges([3, 4, 5, 9]) == [(3, 5), (9, 9)]
    assert kernel_coverage.unreached(_record(kernel_file, [], traced=False)) == []  # compiled: nothing known
    assert conditions_over(str(kernel_file), 1, 7) == ["not A"]


def test_the_summary_of_an_op(kernel_file):
    coverage = {collect.OUTSIDE: {"x:helper:1": _record(kernel_file, [2], launched=False, statements=[2])},
                "op": {"x:kernel:1": _record(kernel_file, [2, 3, 4, 5, 8, 9, 10, 11],
                                             specialisations={"A=True, B=256": 1, "A=True, B=16": 2, "A=True, B=3": 1},
                                             configs={"c1": 1}, configs_total=3)}}
    assert kernel_coverage.summary_lines(coverage) == [
        "kernel coverage op:",
        "  x:kernel: lines 8/9, 3 specialisation(s), configs judged 1/3",
        "    constexprs seen: A=True, B=3|16|256",
        "    never reached: line 7 (under `not A`)",
        f"kernel coverage {collect.OUTSIDE}:",
        "  x:helper: lines 1/1, called from kernels",
    ]
    compiled = _record(kernel_file, [], traced=False, specialisations={"(no constexpr)": 4})
    assert summary.op_lines("op", {"x:k:1": compiled}) == ["kernel coverage op:", "  x:k: lines not traced, 1 specialisation(s)"]
    assert kernel_coverage.summary_lines({"empty": {}}) == []


def test_the_pytest_summary_merges_workers_and_says_when_switched_off(monkeypatch, kernel_file):
    from oracle import pytest_plugin

    written: list[str] = []
    reporter = types.SimpleNamespace(section=lambda title: written.append(f"== {title}"), write_line=written.append)
    monkeypatch.setattr(pytest_plugin, "_kernel_coverage", {})
    monkeypatch.delenv(collect.SWITCH, raising=False)
    for hits in ([2, 3], [4, 5, 7, 8, 9, 10, 11]):
        output = {"oracle_kernel_coverage": json.dumps({"op": {"x:kernel:1": _record(kernel_file, hits)}})}
        pytest_plugin.pytest_testnodedown(types.SimpleNamespace(workeroutput=output), None)
    pytest_plugin.pytest_testnodedown(types.SimpleNamespace(workeroutput={}), None)  # a crashed worker: nothing
    pytest_plugin._write_kernel_coverage(reporter)
    assert written == ["== kernel-oracle: kernel coverage", "kernel coverage op:", "  x:kernel: lines 9/9, 0 specialisation(s)"]
    monkeypatch.setenv(collect.SWITCH, "0")
    written.clear()
    pytest_plugin._write_kernel_coverage(reporter)
    assert written == ["kernel-oracle: kernel coverage off (ORACLE_KERNEL_COVERAGE=0)"]


# --- bad paths ----------------------------------------------------------------------------------


def test_a_kernel_without_source_is_left_out():
    made = types.FunctionType(compile("def made(X):\n    return X\n", "<made at run time>", "exec").co_consts[0], {})
    assert kernel_source(made) is None and kernel_source(object()) is None
    recorder = collect.Recorder()
    recorder.launched(made, (1,), {})
    recorder.config_ran(types.SimpleNamespace(fn=made), "config", 2)
    assert recorder.to_json() == {}


def test_nothing_is_hooked_without_triton_or_when_switched_off(monkeypatch):
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    assert kernel_coverage.install() is False
    monkeypatch.undo()
    monkeypatch.setenv(collect.SWITCH, "0")
    assert kernel_coverage.install() is False and not collect.enabled()
    recorder = collect.Recorder()
    tuner = types.SimpleNamespace(fn=_record, configs=["config", "other"])  # a function with source
    recorder.config_ran(tuner, "config", 2)
    assert recorder.to_json() == {}
    monkeypatch.setenv(collect.SWITCH, "1")
    recorder.config_ran(tuner, "config", 2)
    (record,) = recorder.to_json()[collect.OUTSIDE].values()
    assert record["configs"] == {"config": 1} and record["configs_total"] == 2 and not record["launched"]


def test_a_kernel_file_gone_keeps_its_counts_and_says_its_source_is_missing(tmp_path):
    from oracle.report import html

    gone = _record(tmp_path / "gone.py", [2])
    assert summary.marked_source(gone) == [] and summary.reached_under(gone, 4) == []
    stored = kernel_coverage.for_report({"op": {"gone.py:kernel:1": gone}})
    assert stored["op"]["gone.py:kernel:1"]["source"] == []
    assert [line for line in kernel_coverage.summary_lines(stored) if "never reached" in line][0] == \
        "    never reached: lines 3-11 (under straight-line code)"
    (view,) = html.kernel_coverage_view({"kernel_coverage": stored})
    assert view["kernels"][0]["source"] == [] and view["kernels"][0]["unreached"]
    assert html.kernel_coverage_view({}) == []  # a run made before the key


def test_the_dashboard_of_a_gpu_run_shows_specialisations_and_configs_unmarked(kernel_file):
    """Compiled kernels (a GPU) have no lines: the source is shown unmarked, with the configs judged."""
    from oracle.report import html

    compiled = _record(kernel_file, [], traced=False, specialisations={"A=True, B=3": 2},
                       configs={"BLOCK: 64, num_warps: 2": 3}, configs_total=4)
    document = {"impl": "gpu-kernels", "sweep": "quick", "environment": {"platform": "cuda-X"}, "not_tested": {},
                "cells": [], "cases": [], "aliasing": [], "failures": [], "summary": [],
                "kernel_coverage": kernel_coverage.for_report({"op": {"kernel.py:kernel:1": compiled}})}
    page = html.render(document)
    section = page[page.index("<h2>Kernel coverage</h2>"):]
    assert "lines not traced, 1 specialisation(s), configs judged 1/4" in section
    assert "<code>BLOCK: 64, num_warps: 2</code> (3)" in section and "constexprs seen: <code>A=True, B=3</code>" in section
    assert 'class="hit"' not in section and 'class="unreached"' not in section and "<details class=\"kernel\">" in section
    assert "    x = 4" in section and "lines not traced: the kernel ran compiled" in section
