"""The scale grid (oracle/cases/scale.py): what it covers, how a case at scale is judged on a slice of its
programs, and the gate catching a regression that exists only there.

The grid itself needs a GPU (``--scale``); here on the CPU the slice machinery runs on small cases
with the thresholds lowered, against the same cases judged whole.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from oracle.cases import scale
from oracle.cases import Case
from oracle.engine.devices import native_gpu
from oracle.engine import prepare, run_case
from oracle.declare.implementations import Implementation, load
from oracle.declare.registry import SPECS
from oracle.report import gate
from oracle.report.results import run_noise_model
from tests import broken_impls

ROOT = Path(__file__).parent.parent
CPU = torch.device("cpu")
SIXTEEN_BIT = ("float16", "bfloat16")


def scale_cases(op: str) -> list[Case]:
    return SPECS[op].scale()


def elements(case: Case) -> int:
    return SPECS[case.op].programs.size(case)[1]


# --- what the grid covers ------------------------------------------------------------------------

def test_rms_norm_covers_the_widths_people_train_at_from_16k_to_128k_rows():
    cases = scale_cases("rms_norm")
    for variant in ("llama", "gemma"):
        for dtype in ("float32", *SIXTEEN_BIT):
            mine = [c for c in cases if c.variant == variant and c.dtype == dtype]
            assert {c.dims["cols"] for c in mine} >= {128, 256, 2048, 4096, 8192, 16384, 65536}
            assert {16384, 131072} <= {math.prod(c.dims["lead"]) for c in mine}
            assert {c.layout for c in mine} >= {"contiguous", "transposed"}
            assert "broadcast" in {c.grad_layout for c in mine}
            past = [c for c in mine if elements(c) > 2**31]
            if dtype in SIXTEEN_BIT:  # where a 32-bit element offset wraps, wide rows, one of them strided
                assert {c.dims["cols"] for c in past} == {16384, 65536}
                assert "strided" in {c.layout for c in past}
            else:  # float32 stops at 2^30 (the harness's copies of a 2^31 float32 case need ~130 GB)
                assert not past and max(map(elements, mine)) == 2**30


def test_rope_reaches_the_end_of_128k_tables_and_past_2_31_elements():
    cases = scale_cases("rope")
    assert all(c.dims["seq"] == c.dims["max_pos"] == 131072 for c in cases)
    packed = [c for c in cases if c.variant == "packed"]
    assert packed and all(c.params["first_row"] == "one document" and c.dims["batch"] >= 2 for c in packed)
    for dtype in SIXTEEN_BIT:
        for variant in ("plain", "packed"):
            mine = [c for c in cases if c.dtype == dtype and c.variant == variant]
            assert any(elements(c) > 2**31 for c in mine)
            assert {c.layout for c in mine} == {"contiguous", "transposed"}


SCALED = [name for name, spec in SPECS.items() if spec.scale()]


@pytest.mark.parametrize("op", SCALED)
def test_every_op_goes_past_2_31_elements_in_16_bit_in_every_variant(op):
    cases = scale_cases(op)
    assert {(c.variant, c.dtype) for c in cases} == {(v, d) for v in SPECS[op].variants for d in ("float32", *SIXTEEN_BIT)}
    for variant in SPECS[op].variants:
        for dtype in SIXTEEN_BIT:
            assert any(elements(c) > 2**31 for c in cases if (c.variant, c.dtype) == (variant, dtype))


@pytest.mark.parametrize("op", SCALED)
def test_every_launch_grid_goes_past_cudas_65535_limit_on_its_largest_axis(op):
    """More than 65535 programs (rows, tokens: what the spec's ``programs`` counts), which only grid
    axis 0 accepts (a kernel that put them on axis 1 or 2 fails)."""
    programs = SPECS[op].programs.size
    assert max(programs(c)[0] for c in scale_cases(op)) > 65535


def test_scale_cases_have_labels_of_their_own():
    """Cell keys come from labels: a scale case sharing one with another case would collide in the baseline."""
    for spec in SPECS.values():
        labels = [c.label for c in spec.scale()]
        assert len(set(labels)) == len(labels)
        assert not set(labels) & {c.label for c in spec.sweep(True) + spec.sweep(False)}


# --- which programs are compared ------------------------------------------------------------------

def test_the_slice_takes_the_ends_the_boundaries_and_where_32_bit_offsets_wrap():
    count, per_program = 131073, 16384  # 2^31 + one row of elements
    chosen = scale.compared_programs(count, per_program, seed=5)
    taken = set(chosen.tolist())
    assert chosen.tolist() == sorted(taken) and len(taken) == len(chosen)
    assert {0, 1, count - 1} <= taken
    assert {65535, 65536, 4096, 131071} <= taken  # grid limit and tile boundaries
    assert 2**31 // per_program in taken and 2**31 // per_program - 1 in taken
    assert len(chosen) * per_program <= scale.SLICE_ELEMENTS
    assert torch.equal(chosen, scale.compared_programs(count, per_program, seed=5))  # a rerun judges the same
    assert not torch.equal(chosen, scale.compared_programs(count, per_program, seed=6))  # the random part moves
    assert torch.equal(scale.compared_programs(100, 8, seed=0), torch.arange(100))  # small: every program


def test_chunks_cover_every_program_once():
    covered = torch.cat(list(scale.chunks(1000, scale.SLICE_ELEMENTS // 64)))
    assert torch.equal(covered, torch.arange(1000))


# --- the slice, on the CPU with the thresholds lowered ---------------------------------------------

@pytest.fixture
def small_scale(monkeypatch):
    """Cases past 1000 elements count as at scale; slices and chunks of 2000 elements."""
    monkeypatch.setattr(scale, "AT_SCALE_ELEMENTS", 1000)
    monkeypatch.setattr(scale, "SLICE_ELEMENTS", 2000)


SLICED = [
    Case("rms_norm", "llama", "bfloat16", {"lead": [300], "cols": 64}, "contiguous", "normal",
         {"eps": 1e-6, "weight": "same"}, seed=3),
    Case("rms_norm", "gemma", "float32", {"lead": [2, 150], "cols": 64}, "strided", "normal",
         {"eps": 1e-6, "weight": "same"}, seed=3, grad_layout="broadcast"),
    Case("rope", "packed", "bfloat16", {"batch": 2, "heads": 4, "kv_heads": 2, "seq": 300, "head_dim": 8,
                                        "max_pos": 300}, "transposed", "normal",
         {"theta": 10000.0, "rope_type": "default", "table": "float32", "first_row": "one document"}, seed=1),
    Case("swiglu", "default", "bfloat16", {"shape": [300, 40]}, "transposed", "normal", {}, seed=1),
    Case("swiglu_DWf_DW_dfg_kernel", "default", "float16", {"shape": [300, 40]}, "contiguous", "normal", {}, seed=1),
]


@pytest.mark.parametrize("case", SLICED, ids=lambda c: c.label)
def test_a_case_at_scale_is_judged_on_a_slice_and_the_kernels_pass_it(small_scale, case, device):
    assert scale.judged_on_a_slice(SPECS[case.op], case)
    result = run_case(case.op, case, load("kernels"), device)
    assert result.passed, result.explain()
    count, _ = SPECS[case.op].programs.size(case)
    assert f"of {count} {SPECS[case.op].programs.unit}" in result.scope and result.scope in result.explain()
    for verdict in result.verdicts:
        if verdict.name in SPECS[case.op].programs.summed_gradients:
            assert verdict.shape == (64,)  # dW: summed over every row
        else:  # the programs of the slice only
            assert count not in verdict.shape


def test_the_slice_judges_what_the_whole_case_would_at_those_programs(small_scale, monkeypatch):
    """HF, the truth and the noise of the slice are the whole case's at the programs taken; dW's,
    summed chunk by chunk in float64, are the whole sum's."""
    case = SLICED[0]
    spec = SPECS["rms_norm"]
    sliced = prepare(spec, case, CPU)
    monkeypatch.setattr(scale, "AT_SCALE_ELEMENTS", 2**26)
    whole = prepare(spec, case, CPU)
    index = scale.compared_programs(300, 64, case.seed)
    for name in ("Y", "dX"):
        part = scale.rows(whole.truth.tensors()[name], index)
        assert torch.equal(sliced.truth.tensors()[name], part)
        assert torch.equal(sliced.hf.tensors()[name], scale.rows(whole.hf.tensors()[name], index))
        assert torch.equal(sliced.element_noise[name], scale.rows(whole.element_noise[name], index))
    torch.testing.assert_close(sliced.truth.grads["dW"], whole.truth.grads["dW"], rtol=1e-13, atol=0)
    assert torch.equal(sliced.hf.grads["dW"], whole.hf.grads["dW"])
    torch.testing.assert_close(sliced.element_noise["dW"], whole.element_noise["dW"], rtol=1e-13, atol=0)
    torch.testing.assert_close(sliced.order_noise["dW"], whole.order_noise["dW"], rtol=1e-13, atol=0)
    assert sliced.sum_noise["dW"] == pytest.approx(whole.sum_noise["dW"], rel=1e-13)


@pytest.mark.parametrize("case", SLICED[:2], ids=lambda c: c.label)
def test_a_gradient_derived_chunk_by_chunk_is_one_long_sum(small_scale, case):
    """Note [One long sum] (oracle/noise): dW derived chunk by chunk (noise.derive_summed, 10 chunks
    of 30 rows here) has the variance and the order variance of dW derived on the whole case, one sum
    over its 300 rows; not those of a sum of the chunks' sums, whose order variance is smaller (the
    model before that note: 0.24 and 0.20 of the whole's at the median element on these cases, and
    the float32 case's whole variance 0.28)."""
    from oracle import engine, noise

    spec = SPECS["rms_norm"]
    args = spec.make_args(case, CPU)
    forward = engine.evaluate(spec, spec.reference, args, None)
    upstream = {name: engine.upstream_gradient(case, name, out) for name, out in forward.outputs.items()}
    count, largest = spec.programs.size(case)
    chunks = list(scale.chunks(count, largest // count))
    parts = [(spec.programs.args(args, index), {k: spec.programs.tensor(v, index) for k, v in upstream.items()})
             for index in chunks]
    assert len(chunks) == 10
    whole = noise.derive(spec, args, upstream, torch.float32)
    summed = noise.derive_summed(spec, "dW", iter(parts), torch.float32)
    torch.testing.assert_close(summed.truth["dW"], whole.truth["dW"], rtol=1e-13, atol=0)
    torch.testing.assert_close(summed.variance["dW"], whole.variance["dW"], rtol=1e-12, atol=0)
    torch.testing.assert_close(summed.order_variance["dW"], whole.order_variance["dW"], rtol=1e-12, atol=0)
    torch.testing.assert_close(summed.fast_variance["dW"], whole.fast_variance["dW"], rtol=1e-12, atol=0)
    # the two-level model: each chunk's own derivation, plus one accumulation over the chunks' sums
    derived = [noise.derive(spec, a, u, torch.float32) for a, u in parts]
    sums = torch.stack([d.truth["dW"] for d in derived])
    two_level = sum(d.order_variance["dW"] for d in derived) + noise.rounding.accumulation_variance(
        sums.sum(0), sums.square().sum(0), len(derived), args["W"].dtype)
    ratio = float((two_level / whole.order_variance["dW"]).median())
    assert ratio < 0.7, ratio  # what this test tells apart


def test_a_wrong_row_inside_the_slice_fails_the_case(small_scale):
    case = SLICED[0]
    last = SimpleNamespace(rms_norm=broken_impls.skips_last_row.rms_norm)
    result = run_case("rms_norm", case, Implementation("skips_last_row", last), CPU)
    assert not result.passed and "unwritten" in result.explain()


# --- the gate at scale -------------------------------------------------------------------------------

def test_the_bf16_partials_bug_exists_only_past_its_row_count(device):
    """The broken implementation the GPU test below gates: identical to the kernels (same bits) up to
    its row count, off past it by more than the gate's margins. Here with the count lowered to 64
    rows and tiles of 16. Past it the per-case verdict fails dW by its spread alone (compare.py,
    Note [The spread judgement]), where the kernels pass."""
    broken = Implementation("bf16 partials past 64 rows",
                            SimpleNamespace(rms_norm=broken_impls.rms_norm_bf16_partials_past(64, 16)))
    kernels = load("kernels")
    def dW_verdict(rows: int, impl):
        case = Case("rms_norm", "llama", "bfloat16", {"lead": [rows], "cols": 64}, "contiguous", "normal",
                    {"eps": 1e-6, "weight": "same"}, seed=3)
        result = run_case("rms_norm", case, impl, device)
        assert all(v.passed for v in result.verdicts if v.name != "dW"), result.explain()
        return next(v for v in result.verdicts if v.name == "dW")

    def metrics(v):
        return v.error_ratio, v.bit_identical

    assert metrics(dW_verdict(48, broken)) == metrics(dW_verdict(48, kernels))
    broken_dW, kernels_dW = dW_verdict(300, broken), dW_verdict(300, kernels)
    assert kernels_dW.passed, kernels_dW.reason
    assert not broken_dW.passed and broken_dW.reason.startswith("error spread"), broken_dW.reason
    assert broken_dW.mean_error <= broken_dW.mean_bound  # the distribution judgement alone let it through
    (ratio, identical), (kernels_ratio, kernels_identical) = metrics(broken_dW), metrics(kernels_dW)
    # what the gate sees (oracle/report/gate.py's rules)
    assert ratio > kernels_ratio * (1 + gate.RATIO_MARGIN) + gate.RATIO_SLACK or \
        identical < kernels_identical - gate.BIT_IDENTITY_MARGIN


@pytest.mark.skipif(native_gpu(), reason="on a GPU --scale runs the scale grid (tested with --scale)")
def test_scale_without_a_gpu_is_a_usage_error(report_main_before_sweep, tmp_path):
    """The command's ``main`` in-process (its exit status is what ``python -m`` exits with), before any sweep."""
    code, out, err = report_main_before_sweep("--scale", "--ops", "rms_norm", "--json", tmp_path / "run.json",
                                              "--html", tmp_path / "run.html")
    assert code == 2, out + err
    assert "--scale needs a CUDA GPU" in out


def test_pytest_deselects_the_scale_grid_unless_asked():
    def collecting(*flags) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                 "tests/test_ops.py", "-k", "at_scale", *flags], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    plain, scale = collecting(), collecting("--scale")  # at once: each is a pytest start-up, seconds long
    total = sum(len(spec.scale()) for spec in SPECS.values())
    assert "no tests collected" in plain.communicate(timeout=120)[0]
    assert f"{total}/" in scale.communicate(timeout=120)[0]


@pytest.mark.gpu
@pytest.mark.scale  # opt in with --scale: a 2^31-element case beside a GPU run's other workers can exhaust the GPU
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the scale grid needs a CUDA GPU")
def test_the_committed_h200_gate_fails_a_regression_that_exists_only_at_scale(tmp_path):
    """Against the committed H200 baseline (the full grid and the scale grid, of the kernels), on
    Llama's bf16 RMSNorm: the kernels pass; an implementation equal to them but for dW's partial sums
    added in bf16 past 64k rows fails, on dW of the 128k-row cells only, none of the full grid's."""
    # judged by the model the baseline was made with (a baseline of the other one is refused, exit 2)
    baseline = json.loads((ROOT / "reports/baseline-cuda-NVIDIA-H200.json").read_text())
    noise_model = run_noise_model(baseline)

    def run_gate(impl: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "oracle.report", "--impl", impl, "--full", "--scale",
                               "--ops", "rms_norm", "--dtypes", "bfloat16", "--variants", "llama", "--no-checks",
                               "--noise-model", noise_model, "--gate", "--json", str(tmp_path / "drift.json"),
                               "--html", str(tmp_path / "drift.html")],
                              cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
        print(f"--impl {impl}: exit {proc.returncode}\n" + "\n".join(
            line for line in proc.stdout.splitlines() if "/dW:" in line or line.startswith("gate:")))
        return proc

    kernels = run_gate("kernels")
    assert kernels.returncode == 0, kernels.stdout[-3000:] + kernels.stderr[-2000:]
    broken = run_gate("tests.broken_impls:rms_norm_bf16_partials_past_64k_rows")
    assert broken.returncode == 1, broken.stdout[-3000:] + broken.stderr[-2000:]
    regressed = [line for line in broken.stdout.splitlines() if "rms_norm/llama/bfloat16/" in line]
    assert regressed and all("/dW:" in line and re.search(r"-13107[23]x", line) for line in regressed), \
        broken.stdout[-3000:]
