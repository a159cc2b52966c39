"""The engine itself: it catches real bugs, passes correct code, and its failures are actionable."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from oracle.cases import Case
from oracle.engine import CaseResult, run_case
from oracle.impls import ImplementationUnavailable, load
from oracle.ops import SPECS

RMS = Case("rms_norm", "llama", "float32", {"lead": [3, 2], "cols": 33}, "strided", "normal",
           {"eps": 1e-6, "weight": "same"}, seed=5)
RMS_ZERO_ROWS = Case("rms_norm", "gemma", "bfloat16", {"lead": [6], "cols": 20}, "contiguous", "zero_rows",
                     {"eps": 1e-5, "weight": "same"}, seed=3)
ROPE = Case("rope", "packed", "float16", {"batch": 2, "heads": 6, "kv_heads": 2, "seq": 5, "head_dim": 80,
                                          "max_pos": 12}, "transposed", "normal",
            {"theta": 10000.0, "rope_type": "default", "table": "float32"}, seed=2)
SWIGLU = Case("swiglu", "default", "bfloat16", {"shape": [3, 257]}, "transposed", "normal", {}, seed=4)
FG = Case("swiglu_fg_kernel", "default", "float32", {"shape": [2, 1025]}, "contiguous", "normal", {}, seed=6)
RAW = Case("swiglu_DWf_DW_dfg_kernel", "default", "float16", {"shape": [3, 100]}, "contiguous", "normal", {}, seed=7)


def _run(case: Case, impl: str, device) -> CaseResult:
    return run_case(case.op, case, load(impl), device)


@pytest.mark.parametrize("case", [RMS, RMS_ZERO_ROWS, ROPE, SWIGLU, FG, RAW], ids=lambda c: c.op)
@pytest.mark.parametrize("impl", ["kernels", "hf"])
def test_correct_implementations_pass(case, impl, device):
    result = _run(case, impl, device)
    assert result.passed, result.explain()


@pytest.mark.parametrize("impl, case, caught", [
    ("skips_last_row", RMS, "non-finite where HF is not"),
    ("ignores_eps", RMS_ZERO_ROWS, "non-finite where HF is not"),
    ("wrong_sign", ROPE, "exceeds 2*max|h-t|"),
    ("swiglu_wrong_derivative", SWIGLU, "exceeds 2*max|h-t|"),
    ("leaves_last_unwritten", FG, "non-finite where HF is not"),
])
def test_broken_implementations_fail_the_verdict(impl, case, caught, device):
    result = _run(case, f"tests.broken_impls:{impl}", device)
    assert result.status == "fail", result.explain()
    assert caught in result.explain()


def test_ignoring_eps_passes_where_eps_does_not_matter(device):
    """Both directions: the eps bug is invisible on ordinary rows, so the verdict must not flag it there."""
    ordinary = Case("rms_norm", "llama", "float32", {"lead": [4], "cols": 64}, "contiguous", "large",
                    {"eps": 1e-12, "weight": "same"}, seed=1)
    assert _run(ordinary, "tests.broken_impls:ignores_eps", device).passed


def test_buffers_declared_in_clobbers_must_hold_the_raw_kernels_results(device):
    result = _run(RAW, "tests.broken_impls:raw_backward_not_in_place", device)
    assert [f.check for f in result.findings] == ["buffers"] * 3, result.explain()


def test_a_raw_backward_returning_fresh_tensors_and_declaring_nothing_passes(device):
    """The contract lets a raw kernel keep its inputs and return new tensors, if it declares no CLOBBERS."""
    result = _run(RAW, "tests.broken_impls:raw_backward_fresh_tensors", device)
    assert result.passed, result.explain()


def test_failure_output_names_case_metrics_and_repro(device):
    result = _run(RMS, "tests.broken_impls:skips_last_row", device)
    text = result.explain()
    for expected in ("rms_norm[llama] float32", "lead=[3, 2]", "layout=strided", "seed=5", "max|k-t|",
                     "bit-identical", "python -m oracle.repro --impl tests.broken_impls:skips_last_row"):
        assert expected in text


def test_repro_command_reruns_exactly_that_case(device):
    result = _run(ROPE, "tests.broken_impls:wrong_sign", device)
    command = result.repro.replace("python", sys.executable, 1)
    proc = subprocess.run(command, shell=True, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert "FAIL: rope[packed] float16" in proc.stdout and "dQ" in proc.stdout
    good = subprocess.run(_run(ROPE, "kernels", device).repro.replace("python", sys.executable, 1), shell=True,
                          capture_output=True, text=True)
    assert good.returncode == 0, good.stdout + good.stderr


def test_repro_rejects_bad_input():
    proc = subprocess.run([sys.executable, "-m", "oracle.repro", "{not json"], capture_output=True, text=True)
    assert proc.returncode == 2 and "not a case" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "oracle.repro", json.dumps({**json.loads(RMS.to_json()), "op": "gelu"})],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown op" in proc.stderr


def test_case_json_round_trip():
    for spec in SPECS.values():
        for case in spec.sweep(False):
            assert Case.from_json(case.to_json()) == case


def test_implementation_loading(device):
    assert load("kernels").lacking() == []
    assert load("hf").lacking() == []
    partial = load("tests.broken_impls:only_swiglu")
    assert partial.lacking() == [op for op in SPECS if op != "swiglu"]
    skipped = run_case("rope", ROPE, partial, device)
    assert skipped.status == "skipped" and "has no rope" in skipped.error
    with pytest.raises(ValueError, match="unknown implementation"):
        load("nonsense")
    with pytest.raises(ImplementationUnavailable, match="cannot import"):
        load("no_such_module:impl")
    with pytest.raises(ValueError, match="no attribute"):
        load("tests.broken_impls:no_such_thing")
    with pytest.raises(ValueError, match="none of the contract's ops"):
        load("json:decoder")


def test_liger_is_skipped_with_a_reason_when_missing():
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        with pytest.raises(ImplementationUnavailable, match="pip install 'kernel-oracle\\[liger\\]'"):
            load("liger")
    else:
        assert load("liger").lacking() == [name for name, spec in SPECS.items() if spec.liger is None]


def test_compile_runs_the_hf_maths_and_passes(device):
    """--impl compile: torch.compile of the HF maths. Inductor fuses silu(e) * g into one rounding,
    so it is not HF's bits (the cast-order slip shows in bit-identity) yet passes the ratio test."""
    result = _run(SWIGLU, "compile", device)
    assert result.passed, result.explain()
    assert min(v.bit_identical for v in result.verdicts) < 1.0 or device.type == "cuda"
