"""The engine itself: it catches real bugs, passes correct code, and its failures are actionable."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from oracle import engine, noise
from oracle.cases import Case
from oracle.declare import Dim, Op, Tensor
from oracle.engine import CaseResult, Float64Failure, check_float64, run_case
from oracle.declare.implementations import Implementation, ImplementationUnavailable, load
from oracle.declare.registry import SPECS
from oracle.declare.spec import upstream_gradient

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
    ("skips_last_row", RMS, "non-finite in k where HF is finite"),
    ("ignores_eps", RMS_ZERO_ROWS, "non-finite in k where HF is finite"),
    ("wrong_sign", ROPE, "exceeds 2*max|h-t|"),
    ("swiglu_wrong_derivative", SWIGLU, "exceeds 2*max|h-t|"),
    ("leaves_last_unwritten", FG, "non-finite in k where HF is finite"),
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


@pytest.fixture
def repro_main(monkeypatch, capsys):
    """``python -m oracle.repro``'s ``main`` in-process: ``run(argv)`` gives its exit status, stdout
    and stderr. ``main`` points Inductor's cache through the environment; restored after the test."""
    from oracle import repro

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)

    def run(argv: list[str]) -> tuple[int, str, str]:
        code = repro.main(argv)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def test_repro_command_reruns_exactly_that_case(device, repro_main):
    """The printed command, run as printed by a shell, fails the case; the kernels' command, its
    arguments parsed as the shell does and given to the same ``main``, passes it."""
    result = _run(ROPE, "tests.broken_impls:wrong_sign", device)
    command = result.repro.replace("python", sys.executable, 1)
    proc = subprocess.run(command, shell=True, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert "FAIL: rope[packed] float16" in proc.stdout and "dQ" in proc.stdout
    python, module, name, *argv = shlex.split(_run(ROPE, "kernels", device).repro)
    assert (python, module, name) == ("python", "-m", "oracle.repro"), python
    code, out, err = repro_main(argv)
    assert code == 0 and "rope[packed] float16" in out, out + err


def test_repro_rejects_bad_input(repro_main):
    code, _, err = repro_main(["{not json"])
    assert code == 2 and "not a case" in err, err
    code, _, err = repro_main([json.dumps({**json.loads(RMS.to_json()), "op": "gelu"})])
    assert code == 2 and "unknown op" in err, err


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
        from peers.liger import builtin

        assert load("liger").lacking() == [name for name in SPECS if not hasattr(builtin, name)]


def test_compile_runs_the_hf_maths_and_passes(device):
    """--impl compile: torch.compile of the HF maths. Inductor fuses silu(e) * g into one rounding,
    so it is not HF's bits (the cast-order slip shows in bit-identity) yet passes the ratio test."""
    result = _run(SWIGLU, "compile", device)
    assert result.passed, result.explain()
    assert min(v.bit_identical for v in result.verdicts) < 1.0 or device.type == "cuda"


# --- failure text: the verdict and the repro, without object reprs ---------------------------------


def test_a_failing_suite_test_prints_the_verdict_not_object_reprs():
    """The generic suite's failure: the verdict text (case, metrics, the failing tensor, the repro), and
    hypothesis's failing example naming the implementation and the case, not their reprs."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "tests/test_ops.py",
                           "--impl", "tests.broken_impls:swiglu_de_sign_flipped", "--ops", "swiglu",
                           "-k", "matches_hf__swiglu__float32"], capture_output=True, text=True, env={**os.environ, "CI": "true"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "FAIL de" in out and "rerun: python -m oracle.repro --impl tests.broken_impls:swiglu_de_sign_flipped" in out, out
    assert "CaseResult(case=" not in out and "TensorVerdict(" not in out and "where False" not in out, out
    example = out[out.index("Failing explicit example"):]
    assert "impl=Implementation('tests.broken_impls:swiglu_de_sign_flipped')" in example, example
    assert "case=Case('swiglu[default] float32" in example and "namespace(" not in example, example


def test_a_case_result_has_a_short_repr(device):
    result = _run(RMS, "tests.broken_impls:skips_last_row", device)
    assert repr(result) == f"CaseResult(fail: {RMS.summary()} [impl tests.broken_impls:skips_last_row])"
    assert "worst {" not in result.explain() and "'index'" not in result.explain()


FLOAT64_RMS = SPECS["rms_norm"].float64_cases[0]


def test_a_float64_gradcheck_failure_carries_the_case_its_repro_and_the_no_float64_hint(device):
    """dX without its projection term, in float64: gradcheck's mismatch, with the case line, the command
    that reruns the check, and NO_FLOAT64."""
    with pytest.raises(Float64Failure) as failure:
        check_float64(SPECS["rms_norm"], FLOAT64_RMS, load("tests.broken_impls:rms_norm_dx_missing_projection"), device)
    text = str(failure.value)
    assert text.startswith("gradcheck: the backward disagrees with finite differences in float64"), text
    assert f"float64 check of {FLOAT64_RMS.summary()}  [impl tests.broken_impls:rms_norm_dx_missing_projection]" in text
    assert "rerun: python -m oracle.repro --impl tests.broken_impls:rms_norm_dx_missing_projection --float64" in text
    assert "NO_FLOAT64 = {'rms_norm'}" in text and "tensor(" not in text, text
    check_float64(SPECS["rms_norm"], FLOAT64_RMS, load("kernels"), device)  # the kernels' backward passes


def test_an_error_in_float64_keeps_its_type_and_carries_the_same_notes(device):
    with pytest.raises(TypeError, match="accumulator dtype mismatch") as failure:
        check_float64(SPECS["rms_norm"], FLOAT64_RMS, load("tests.broken_impls:backward_type_error"), device)
    notes = failure.value.__notes__
    assert notes[0] == f"float64 check of {FLOAT64_RMS.summary()}  [impl tests.broken_impls:backward_type_error]"
    assert notes[1].startswith("rerun: python -m oracle.repro --impl tests.broken_impls:backward_type_error --float64")
    assert "NO_FLOAT64" in notes[2]


def test_the_float64_repro_reruns_the_check(repro_main):
    """``oracle.repro --float64``'s verdicts (its main in-process: the command's own run is
    test_repro_command_reruns_exactly_that_case's)."""

    def repro(impl: str, case: Case = FLOAT64_RMS) -> tuple[int, str]:
        code, out, err = repro_main(["--impl", impl, "--float64", case.to_json()])
        return code, out + err

    code, out = repro("tests.broken_impls:rms_norm_dx_missing_projection")
    assert code == 1 and out.startswith("FAIL: gradcheck:") and "NO_FLOAT64" in out, out
    code, out = repro("tests.broken_impls:backward_type_error")
    assert code == 1 and "TypeError: accumulator dtype mismatch" in out, out
    code, out = repro("tests.broken_impls:declares_no_float64")
    assert code == 0 and out.startswith("SKIP: float64 check"), out
    code, out = repro("kernels")
    assert code == 0 and out.startswith("PASS: float64 check"), out
    assert repro("kernels", RMS)[0] == 2  # a float32 case has no float64 check


# --- noise models: one function builds them ---------------------------------------------------------


def _exp_scaled(X, W):
    return torch.exp(X.float()).to(X.dtype) * W


# exp(X) * W over rows: dW sums over every row, the gradient judged whole at scale; a hand-written model.
EXP_SCALED = Op("exp_scaled", reference=_exp_scaled, inputs={"X": Tensor("rows", "cols"), "W": Tensor("cols")},
                dims={"rows": Dim(1, 64, programs=True), "cols": Dim(1, 64)},
                scale=({"rows": 64, "cols": 8},), outputs=("Y",),
                noise={name: (lambda args, upstream: torch.full((), 1e-3, dtype=torch.float64))
                       for name in ("Y", "dX", "dW")})


@pytest.mark.parametrize("maths", ["fast", "exact"])
def test_a_gradient_summed_over_every_program_gets_the_noise_model_every_tensor_gets(maths, device, monkeypatch):
    """A case at scale judges its dW whole (engine._summed_over_every_program): its hand-written model
    gets fast maths' room there too, as every other tensor's does (engine.noise_models)."""
    monkeypatch.setenv("ORACLE_NOISE_MODEL", "declared")  # the hand-written model is what this tests
    spec = EXP_SCALED.spec
    case = Case("exp_scaled", "default", "float32", {"rows": 64, "cols": 8}, "contiguous", "normal", {}, seed=2)
    args = spec.make_args(case, device)
    prepared = engine._prepare_on_a_slice(spec, case, args, upstream_gradient, maths)
    whole = engine.noise_models(spec, prepared.args, prepared.upstream,
                                lambda: noise.derive(spec, prepared.args, prepared.upstream, torch.float32), maths)
    torch.testing.assert_close(prepared.element_noise["dW"], whole.element["dW"], rtol=1e-9, atol=0)
    if maths == "fast":  # exp's room on top of the hand-written 1e-3, as for Y
        assert float((prepared.element_noise["dW"] - 1e-3).min()) > 0
        assert torch.equal(prepared.exact_noise["dW"], torch.full((), 1e-3, dtype=torch.float64))
    else:
        assert torch.equal(prepared.element_noise["dW"], torch.full((), 1e-3, dtype=torch.float64))


# --- the derived model's generic rule, named -----------------------------------------------------


def test_a_reference_op_the_generic_rule_models_is_named_in_the_verdict(device):
    prod = Op("row_prod", reference=lambda X: X.prod(-1), inputs={"X": Tensor("rows", "cols")},
              dims={"rows": Dim(1, 8), "cols": Dim(1, 8)})
    case = Case("row_prod", "default", "float32", {"rows": 3, "cols": 5}, "contiguous", "normal", {}, seed=1)
    result = run_case(prod.spec, case, Implementation("reference", SimpleNamespace(row_prod=lambda X: X.prod(-1))),
                      device)
    calls = result.generic.get("prims.prod.default", 0)  # forward and backward
    assert result.passed and set(result.generic) == {"prims.prod.default"} and calls > 1, result.explain()
    assert f"noise: the derived model had no exact rule for prims.prod.default ({calls} calls): they were modelled " \
           "by its generic rule" in result.explain()
    assert "generic rule" not in _run(RMS, "kernels", device).explain()  # exact rules only (and a hand-written model)


def test_an_output_dtype_unlike_hfs_fails_its_verdict_and_corrupts_no_gradient(device):
    """The residual branch beside the op receives the gradient handed to backward, rounded to the
    op's output dtype where that differs from HF's (Liger's and Unsloth's RMSNorm with a float32
    weight): the verdict names the dtype, and no incoming-gradient finding is made up."""
    case = Case("rms_norm", "llama", "bfloat16", {"lead": [3, 5], "cols": 64},
                params={"eps": 1e-6, "weight": "float32"})
    broken = run_case(case.op, case, load("tests.broken_impls:output_in_the_inputs_dtype"), device)
    assert broken.status == "fail" and not broken.findings, broken.findings
    assert "dtype torch.bfloat16 differs from HF's torch.float32" in broken.verdicts[0].reason
    correct = run_case(case.op, case, load("hf"), device)
    assert correct.status == "pass" and not correct.findings
