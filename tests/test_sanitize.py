"""``python -m oracle.sanitize``: reading compute-sanitizer's output (on outputs recorded on the H200,
tests/data/sanitizer/), the verdict on each run, the command line and its exit codes, and the target's
exactly-sized storage, on the CPU; the sanitizer itself on a GPU (``gpu`` marker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from oracle.engine import run_case
from oracle.declare.implementations import load
from oracle.checks.memory import BROADCAST_ROWS, CONTIGUOUS, Layout
from oracle.declare.registry import SPECS
from oracle.sanitize import __main__ as cli
from oracle.sanitize import findings as F
from oracle.sanitize import runner, target
from oracle.sanitize.runner import Run, judge

ROOT = Path(__file__).parent.parent
DATA = Path(__file__).parent / "data" / "sanitizer"
TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")


def parsed(name: str) -> F.Output:
    return F.parse((DATA / name).read_text())


# --- reading the output ----------------------------------------------------------------------------


def test_records_of_one_access_group_into_one_finding_with_a_count():
    """The H200's memcheck of a scratch Triton kernel with an unmasked store (less most of the host
    backtraces): 12 writes at one place, then the launch failure they cause, on two API calls."""
    output = parsed("memcheck-unmasked-store.txt")
    found = output.findings()
    assert [f.describe() for f in found] == [
        "Invalid __global__ write of size 8 bytes at _bad+0x150 in target.py:24 (12 accesses)",
        *(f'Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to '
          f"{call}. (1 report)" for call in ("cudaDeviceSynchronize", "cudaGetLastError")),
    ]
    assert output.summary_errors == 14 == sum(f.count for f in found)  # every error explained by a record
    write = found[0]
    assert write.example[0] == "by thread (116,0,0) in block (3,0,0)"
    assert not any("Host Frame" in detail for detail in write.example)
    assert "Target application returned an error" in output.notes
    assert output.cases_run is None and "torch.AcceleratorError: CUDA error: unspecified launch failure" in output.target_lines


def test_a_finding_of_this_command_names_its_kernel_line_and_first_case():
    """The H200's memcheck of tests.broken_gpu_kernels:unmasked_tail_load under this command (its log,
    less the host backtraces): reads past a 4-byte e in the first case, which kills the context."""
    output = parsed("memcheck-unmasked-load.txt")
    read, *launch_failures = output.findings()
    assert read.describe() == ("Invalid __global__ read of size 4 bytes at _unmasked_load_kernel+0xd0 in "
                               "broken_gpu_kernels.py:49 (64 accesses)")
    assert read.first_case == "swiglu_fg_kernel-default-float32-1x1-contiguous-normal"
    assert len(launch_failures) == 2 and output.summary_errors == 66 == sum(f.count for f in output.findings())
    run = judge("swiglu_fg_kernel", "memcheck", Path("x.log"), output, runner.ERROR_EXITCODE, 14.0)
    assert run.status == "findings" and run.cases is None


def test_a_clean_run_of_this_command():
    """The H200's memcheck of the kernels' swiglu_fg_kernel under this command: every case, no error."""
    run = judge("swiglu_fg_kernel", "memcheck", Path("x.log"), parsed("memcheck-clean-run.txt"), 0, 9.4)
    assert (run.status, run.cases, run.findings) == ("clean", 15, [])


@pytest.mark.parametrize("tool", TOOLS)
def test_clean_outputs_have_no_findings(tool):
    output = parsed(f"{tool}-clean.txt")
    assert output.findings() == [] and output.summary_errors == 0
    assert output.records == [] and output.notes == []


def test_errors_the_summary_counts_but_no_record_shows_are_a_finding():
    output = F.parse("========= COMPUTE-SANITIZER\ncases: 3\n========= ERROR SUMMARY: 3 errors\n")
    [finding] = output.findings()
    assert finding.from_summary and finding.count == 3
    assert finding.describe() == "3 error(s) in the sanitizer's summary that no record shows"


def test_errors_past_the_print_limit_are_counted():
    text = ("========= Invalid __global__ read of size 2 bytes\n=========     at k+0x10 in k.py:3\n=========\n"
            "========= ERROR SUMMARY: 5 errors\n"
            "========= ERROR SUMMARY: 4 errors were not printed. Use --print-limit option to adjust the number of "
            "printed errors\n")
    record, rest = F.parse(text).findings()
    assert record.describe() == "Invalid __global__ read of size 2 bytes at k+0x10 in k.py:3 (1 access)"
    assert rest.describe() == "4 more error(s) not printed (past --print-limit)"


def test_racecheck_hazards_of_one_race_group_together():
    """Racecheck's records as NVIDIA documents them: the race's two sides, hazard counts that differ."""
    race = ("========= Error: Race reported between Write access at k+0x430 in k.py:46\n"
            "=========     and Read access at k+0x770 in k.py:55 [{n} hazards]\n=========\n")
    text = ("========= COMPUTE-SANITIZER\n" + race.format(n=248) + race.format(n=7)
            + "========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)\n")
    [finding] = F.parse(text).findings()
    assert finding.describe() == ("Error: Race reported between Write access at k+0x430 in k.py:46 and Read access "
                                  "at k+0x770 in k.py:55 (2 reports)")


def test_a_finding_names_the_case_it_first_appeared_in():
    text = ("case: swiglu-a\ncase: swiglu-b\n========= Invalid __global__ write of size 4 bytes\n"
            "=========     at k+0x8 in k.py:9\n=========\ncase: swiglu-c\n"
            "========= Invalid __global__ write of size 4 bytes\n=========     at k+0x8 in k.py:9\n=========\n"
            "cases: 3\n========= ERROR SUMMARY: 2 errors\n")
    output = F.parse(text)
    [finding] = output.findings()
    assert (finding.count, finding.first_case, output.cases_run) == (2, "swiglu-b", 3)


# --- the verdict on a run --------------------------------------------------------------------------

CLEAN = "========= COMPUTE-SANITIZER\ncase: x\ncases: 1\n========= ERROR SUMMARY: 0 errors\n"
CRASHED = ("========= COMPUTE-SANITIZER\ncase: rope-1\nTraceback (most recent call last):\n  File \"t.py\", line 1\n"
           "RuntimeError: boom\n========= Target application returned an error\n========= ERROR SUMMARY: 0 errors\n")


def verdict(text: str, returncode: int | None) -> Run:
    return judge("rope", "memcheck", Path("x.log"), F.parse(text), returncode, 3.0)


def test_a_run_is_clean_only_when_every_case_ran_and_nothing_was_counted():
    assert verdict(CLEAN, 0).status == "clean" and verdict(CLEAN, 0).cases == 1
    assert verdict(CLEAN.replace("cases: 1\n", ""), 0).error == "the target stopped before its last case"
    assert verdict(CLEAN.replace("========= ERROR SUMMARY: 0 errors\n", ""), 0).error == \
        "compute-sanitizer printed no summary"


def test_findings_win_over_the_exit_status():
    run = verdict((DATA / "memcheck-unmasked-store.txt").read_text(), runner.ERROR_EXITCODE)
    assert run.status == "findings" and len(run.findings) == 3


def test_a_target_that_fails_without_a_record_is_an_error_with_its_last_lines():
    run = verdict(CRASHED, 1)
    assert run.status == "error" and run.error == "the target failed (exit 1) during case rope-1"
    assert "RuntimeError: boom" in run.tail and "Target application returned an error" in run.tail
    assert verdict(CRASHED, None).error.startswith("timed out after 3 s during case rope-1")
    assert verdict(CRASHED, -9).error.startswith("killed by signal 9")


def test_report_lines():
    runs = [verdict(CLEAN, 0), judge("swiglu_fg_kernel", "memcheck", Path("s.log"), parsed("memcheck-unmasked-store.txt"),
                                     86, 9.0), verdict(CRASHED, 1)]
    lines = [text for text, _ in cli.report_lines(runs, {"geglu": "no GeGLU here"})]
    assert lines[0] == "rope             memcheck   clean (1 cases, 3.0 s)"
    assert lines[1] == ("swiglu_fg_kernel memcheck   Invalid __global__ write of size 8 bytes at _bad+0x150 in "
                        "target.py:24 (12 accesses)  log: s.log")
    assert lines[4] == "rope             memcheck   error: the target failed (exit 1) during case rope-1  log: x.log"
    assert lines[-1] == "geglu            -          not tested: no GeGLU here"
    assert cli.summary_line("kernels", runs, {}, 12.3).startswith(
        "kernels: 3 runs (2 op(s) x 1 tool(s)) in 12 s: 1 clean, 1 with findings (3 distinct), 1 failed")


# --- the command line ------------------------------------------------------------------------------


def test_on_a_machine_without_a_cuda_gpu_it_exits_2_with_the_reason():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, even on a machine that has one
    proc = subprocess.run([sys.executable, "-m", "oracle.sanitize", "--impl", "kernels"], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=120, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "error: needs a CUDA GPU: compute-sanitizer checks device code"


@pytest.mark.parametrize("argv, reason", [
    (["--impl", "hf", "--ops", "nope"], "error: unknown op(s) nope: the contract's ops are"),
    (["--impl", "tests.broken_gpu_kernels:unmasked_tail_store", "--ops", "rms_norm"],
     "declares it lacks rms_norm (a broken swiglu_fg_kernel only), yet --ops asks for it"),
    (["--impl", "no_such_module:ops"], "error: cannot import 'no_such_module'"),
], ids=["unknown op", "declared lacking", "unavailable"])
def test_usage_errors_exit_2_before_any_device_is_needed(argv, reason, capsys):
    assert cli.main(argv) == 2
    out = capsys.readouterr().out
    assert reason in out and len(out.strip().splitlines()) == 1


def test_without_compute_sanitizer_it_exits_2_with_the_reason(monkeypatch, capsys):
    import oracle.engine.devices

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(oracle.engine.devices, "native_gpu", lambda: True)
    monkeypatch.setattr(runner, "find_compute_sanitizer", lambda: None)
    assert cli.main(["--impl", "hf", "--ops", "swiglu"]) == 2
    assert capsys.readouterr().out.strip() == f"error: {cli.NO_SANITIZER}"


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_compute_sanitizer_is_found_on_path_then_cuda_home_then_usr_local_cuda(tmp_path, monkeypatch):
    on_path = _executable(tmp_path / "path" / "compute-sanitizer")
    in_home = _executable(tmp_path / "home" / "bin" / "compute-sanitizer")
    in_default = _executable(tmp_path / "default" / "bin" / "compute-sanitizer")
    monkeypatch.setattr(runner, "CUDA_HOME_DEFAULT", tmp_path / "default")
    find = runner.find_compute_sanitizer
    assert find({"PATH": str(on_path.parent), "CUDA_HOME": str(tmp_path / "home")}) == on_path
    assert find({"PATH": str(tmp_path), "CUDA_HOME": str(tmp_path / "home")}) == in_home
    assert find({}) == in_default
    monkeypatch.setattr(runner, "CUDA_HOME_DEFAULT", tmp_path / "nowhere")
    assert find({"CUDA_HOME": str(tmp_path / "nowhere")}) is None


def test_the_command_line_of_one_run():
    command = runner.command_line(Path("/cuda/bin/compute-sanitizer"), "racecheck", "pkg.mod:ops", "rope")
    assert command == ["/cuda/bin/compute-sanitizer", "--tool", "racecheck", "--error-exitcode", "86",
                       "--print-limit", str(runner.PRINT_LIMIT),
                       sys.executable, "-m", "oracle.sanitize.target", "--impl", "pkg.mod:ops", "--op", "rope"]
    env = runner.target_environment({"PATH": "/bin"})
    assert env == {"PATH": "/bin", "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    assert runner.log_path(Path("out"), "tests.broken_gpu_kernels:unmasked_tail_store", "rope", "memcheck") == \
        Path("out/tests.broken_gpu_kernels_unmasked_tail_store-rope-memcheck.log")


FAKE_SANITIZER = """#!{python}
# compute-sanitizer's stand-in: runs the target on the CPU and reports one record under initcheck
import subprocess, sys
args, tool = sys.argv[1:], sys.argv[2]
while args[0].startswith("--"):
    args = args[2:]
print("========= COMPUTE-SANITIZER", flush=True)
code = subprocess.call(args + ["--device", "cpu"])
if tool == "initcheck":
    print("========= Uninitialized __global__ memory read of size 4 bytes\\n=========     at k+0x10 in k.py:7")
print(f"========= ERROR SUMMARY: {{int(tool == 'initcheck')}} errors", flush=True)
sys.exit(86 if tool == "initcheck" else code)
"""


def test_each_op_and_tool_runs_in_its_own_process_with_its_log(tmp_path, monkeypatch, capsys):
    """The whole command, with a stand-in for compute-sanitizer that runs the target on the CPU."""
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(FAKE_SANITIZER.format(python=sys.executable))
    fake.chmod(0o755)
    monkeypatch.setattr(cli, "environment_problem", lambda: (None, fake))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.chdir(tmp_path)
    status = cli.main(["--impl", "hf", "--ops", "swiglu_fg_kernel", "--tools", "memcheck", "initcheck",
                       "--json", "out.json"])
    out = capsys.readouterr().out
    assert status == 1, out
    log = Path("reports/out/sanitize/hf-swiglu_fg_kernel-initcheck.log")
    assert "swiglu_fg_kernel memcheck   clean (15 cases, " in out
    assert (f"swiglu_fg_kernel initcheck  Uninitialized __global__ memory read of size 4 bytes at k+0x10 in k.py:7 "
            f"(1 access)  log: {log}") in out
    assert "hf: 2 runs (1 op(s) x 2 tool(s)) in" in out and "1 clean, 1 with findings (1 distinct), 0 failed" in out
    data = json.loads(Path("out.json").read_text())
    assert [(run["tool"], run["status"], run["cases"]) for run in data["runs"]] == \
        [("memcheck", "clean", 15), ("initcheck", "findings", 15)]
    assert data["exit"] == 1 and log.read_text().count("case: ") == 15
    assert data["lines"][1].startswith("swiglu_fg_kernel initcheck  Uninitialized __global__ memory read")


# --- the target: exactly-sized storage ---------------------------------------------------------------


def spans_its_storage_exactly(t: torch.Tensor) -> bool:
    """The tensor's last element is its storage's last, and the storage begins where its offset says."""
    last = t.storage_offset() + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.untyped_storage().nbytes() == (last + 1) * t.element_size()


@pytest.mark.parametrize("layout, elements", [
    (CONTIGUOUS, 20), (Layout(order=(1, 0)), 20), (Layout(offset=7), 27),
    (Layout(pad=3), 29),  # rows 8 apart, nothing after the last row's 5th element
    (BROADCAST_ROWS, 5),  # one row under a stride-0 view
])
def test_exact_storage_holds_just_the_span_of_its_layout(layout, elements):
    t = target.exact_storage((4, 5), torch.bfloat16, "cpu", layout)
    assert t.shape == (4, 5) and t.stride() == layout.strides((4, 5))
    assert t.untyped_storage().nbytes() == elements * 2 and spans_its_storage_exactly(t)


def _one_case_per_layout(spec) -> list:
    cases = {}
    for case in target.cases_of(spec):
        cases.setdefault((case.layout, case.grad_layout), case)
    return list(cases.values())


@pytest.mark.parametrize("op", sorted(SPECS))
def test_every_argument_and_gradient_sits_in_exact_storage(op):
    spec, hf = SPECS[op], load("hf").op(op)
    for case in _one_case_per_layout(spec):
        args, leaves = target.place_arguments(spec, case, spec.make_args(case, "cpu"), "cpu")
        tensors = {name: t for name, t in args.items() if isinstance(t, torch.Tensor)}
        assert all(spans_its_storage_exactly(t) for t in tensors.values()), case.label
        for name in spec.layout_args:
            assert tensors[name].stride() == spec.layout_of(case.layout, tuple(tensors[name].shape)).strides(
                tuple(tensors[name].shape)), case.label
        if spec.differentiable:
            outputs = dict(zip(spec.outputs, spec.call(hf, args)))
            gradients = target.place_gradients(spec, case, outputs, "cpu")
            assert all(spans_its_storage_exactly(g) for g in gradients.values()), case.label
            leaves = target.run_case(spec, hf, case, "cpu")
            assert all(leaf.grad is not None for leaf in leaves.values()), case.label  # autograd reached them


def test_the_target_runs_every_case_of_the_quick_grid(capsys):
    assert target.main(["--impl", "hf", "--op", "swiglu", "--device", "cpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    cases = target.cases_of(SPECS["swiglu"])
    assert out == [f"case: {case.label}" for case in cases] + [f"cases: {len(cases)}"]
    assert all(case.dtype != "float64" for case in cases)


# the quick grid's large and non-finite cases overflow exp in the interpreter's numpy, as on a GPU (silently there)
@pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")
def test_the_target_runs_an_autotuned_kernel_one_config_a_case_as_the_verdict_does(capsys, device):
    """Never a benchmark under the sanitizer: each case runs the config its verdict and repro run
    (oracle/cases/autotune.py), so the quick grid's cases cover both configs; the log names them and the
    parser keeps them out of the target's own lines."""
    op = "swiglu_fg_kernel"
    impl = "tests.autotuned_impls:right"
    assert target.main(["--impl", impl, "--op", op, "--device", str(device)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    cases = target.cases_of(SPECS[op])
    ran = {lines[i][len("case: "):]: lines[i + 1][len(F.AUTOTUNED_MARK):] for i in range(0, 2 * len(cases), 2)}
    assert list(ran) == [case.label for case in cases] and lines[-1] == f"cases: {len(cases)}"
    assert len(set(ran.values())) == 2, ran  # both configs judged
    for case in cases[:2]:
        assert [ran[case.label]] == run_case(op, case, load(impl), device).configs
    assert F.parse(out).target_lines == []


def test_a_bad_op_module_exits_2_naming_it(capsys, monkeypatch):
    monkeypatch.setenv("ORACLE_OP_MODULES", "")  # main hands --op-module to its targets there: restored after
    assert cli.main(["--impl", "hf", "--op-module", "no_such_module.declared"]) == 2
    out = capsys.readouterr().out
    assert "no_such_module.declared" in out and len(out.strip().splitlines()) == 1


def test_the_target_runs_a_declared_op_named_in_the_environment():
    """--op-module reaches the targets (processes of their own, as here) through ORACLE_OP_MODULES."""
    project = Path(__file__).parent / "declared_project"
    env = {**os.environ, "ORACLE_OP_MODULES": "declared_ops",
           "PYTHONPATH": os.pathsep.join([str(project), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "oracle.sanitize.target", "--impl", "hf", "--op", "softmax",
                           "--device", "cpu"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1].startswith("cases: ") and len(lines) == int(lines[-1].split()[1]) + 1, proc.stdout


# --- on a GPU: the sanitizer itself ------------------------------------------------------------------

needs_sanitizer = pytest.mark.skipif(
    not (torch.cuda.is_available() and runner.find_compute_sanitizer()),
    reason="needs a CUDA GPU and compute-sanitizer (on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin)")


def sanitize(tmp_path: Path, *argv: str) -> tuple[subprocess.CompletedProcess, dict]:
    """The command in a scratch directory (its logs go there), this checkout first on the path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "oracle.sanitize", *argv, "--json", "out.json"], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=300, check=False)
    data = json.loads((tmp_path / "out.json").read_text()) if (tmp_path / "out.json").exists() else {}
    return proc, data


@pytest.mark.gpu
@needs_sanitizer
def test_the_kernels_raw_swiglu_forward_is_clean_under_memcheck(tmp_path):
    proc, data = sanitize(tmp_path, "--impl", "kernels", "--ops", "swiglu_fg_kernel", "--tools", "memcheck")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [run] = data["runs"]
    assert run["status"] == "clean" and run["cases"] == len(target.cases_of(SPECS["swiglu_fg_kernel"]))


@pytest.mark.gpu
@needs_sanitizer
@pytest.mark.parametrize("name, expected", [("unmasked_tail_store", "Invalid __global__ write"),
                                            ("unmasked_tail_load", "Invalid __global__ read")])
def test_memcheck_reports_an_unmasked_tail(tmp_path, name, expected):
    proc, data = sanitize(tmp_path, "--impl", f"tests.broken_gpu_kernels:{name}", "--tools", "memcheck")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert any(expected in line and "swiglu_fg_kernel" in line for line in proc.stdout.splitlines()), proc.stdout
    [run] = data["runs"]
    assert run["status"] == "findings" and Path(tmp_path / run["log"]).is_file()
