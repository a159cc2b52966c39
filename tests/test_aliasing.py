"""Every aliasing check (docs/design.md §4) proven both ways: it flags a deliberately broken
implementation, saying what was corrupted and where, and stays silent on the kernels."""

from __future__ import annotations

import pytest
import torch

from oracle.checks import aliasing
from oracle.cases import Case
from oracle.engine import run_case
from oracle.declare.implementations import load
from oracle.checks.memory import MARGIN_BYTES, MARGIN_CAP_BYTES, GuardedTensor
from oracle.declare.registry import SPECS

RMS = Case("rms_norm", "llama", "bfloat16", {"lead": [2, 3], "cols": 40}, "contiguous", "normal",
           {"eps": 1e-6, "weight": "same"}, seed=11)
ROPE = Case("rope", "packed", "float32", {"batch": 2, "heads": 4, "kv_heads": 2, "seq": 3, "head_dim": 16,
                                          "max_pos": 8}, "contiguous", "normal",
            {"theta": 10000.0, "rope_type": "default", "table": "float32"}, seed=12)
SWIGLU = Case("swiglu", "default", "float16", {"shape": [4, 33]}, "contiguous", "normal", {}, seed=13)
FG = Case("swiglu_fg_kernel", "default", "bfloat16", {"shape": [2, 50]}, "contiguous", "normal", {}, seed=14)
RAW = Case("swiglu_DWf_DW_dfg_kernel", "default", "float32", {"shape": [5, 7]}, "contiguous", "normal", {}, seed=15)


def _main_run_findings(case, impl, device):
    return run_case(case.op, case, load(impl), device).findings


def _check_findings(check, case, impl, device):
    return aliasing.run_check(check, SPECS[case.op], case, load(impl), device)


@pytest.mark.parametrize("case", [RMS, ROPE, SWIGLU, FG, RAW], ids=lambda c: c.op)
def test_kernels_have_no_findings(case, device):
    assert _main_run_findings(case, "kernels", device) == []
    for check in aliasing.applicable(SPECS[case.op]):
        assert _check_findings(check, case, "kernels", device) == [], check


def test_1_snapshot_catches_an_undeclared_input_write(device):
    findings = _main_run_findings(RMS, "tests.broken_impls:modifies_undeclared_input", device)
    hit = [f for f in findings if f.check == "snapshot" and f.tensor == "X" and f.phase == "forward"]
    assert hit and hit[0].index == [0, 0, 0] and hit[0].found != hit[0].expected, findings


def test_2_incoming_gradient_flags_the_kernels_opt_in_in_place_mode(device):
    """Expected detection: write_dx_into_dy=True corrupts the gradient a residual branch shares."""
    findings = _main_run_findings(RMS, "tests.broken_impls:kernels_writing_dx_into_dy", device)
    checks = {(f.check, f.tensor) for f in findings}
    assert ("incoming-gradient", "dY") in checks, findings
    assert ("incoming-gradient", "residual branch of Y") in checks, findings


def test_2_sum_loss_catches_a_backward_that_reads_the_gradient_with_the_wrong_strides(device):
    findings = _check_findings("sum-loss", RMS, "tests.broken_impls:assumes_dense_gradient", device)
    assert findings and "out of bounds" in findings[0].message, findings
    assert _check_findings("sum-loss", RMS, "hf", device) == []


def test_2_shared_input_catches_a_backward_that_overwrites_its_saved_inputs(device):
    findings = _check_findings("shared-input", SWIGLU, "tests.broken_impls:overwrites_saved_inputs", device)
    assert {f.tensor for f in findings if f.check == "shared-input"} >= {"the other consumer of e",
                                                                         "the other consumer of g"}, findings


def test_retain_graph_catches_a_backward_that_overwrites_its_saved_inputs(device):
    findings = _check_findings("retain-graph", SWIGLU, "tests.broken_impls:overwrites_saved_inputs", device)
    assert {f.tensor for f in findings} == {"de", "dg"}, findings
    # ... and the main run sees the same bug as inputs changing during backward.
    main = _main_run_findings(SWIGLU, "tests.broken_impls:overwrites_saved_inputs", device)
    assert {(f.check, f.tensor, f.phase) for f in main} >= {("snapshot", "e", "backward"), ("snapshot", "g", "backward")}


def test_3_views_catch_writes_that_ignore_strides(device):
    findings = _check_findings("views", ROPE, "tests.broken_impls:ignores_strides", device)
    assert any(f.check == "views" and f.tensor == "bystander" for f in findings), findings


def test_4_guard_bands_catch_a_write_past_the_end(device):
    findings = _main_run_findings(FG, "tests.broken_impls:writes_past_the_end", device)
    hit = [f for f in findings if f.check == "guard-band"]
    assert hit and "offset 100" in hit[0].message, findings  # the element right after 2 x 50


def test_5_poisoned_allocations_reveal_an_unwritten_output(device):
    findings = _main_run_findings(FG, "tests.broken_impls:leaves_last_unwritten", device)
    assert [(f.check, f.tensor) for f in findings] == [("unwritten", "h")], findings


@pytest.mark.parametrize("impl, case", [("untracked_in_place", ROPE), ("raw_backward_untracked", RAW)])
def test_6_version_counter_catches_silent_in_place_writes(impl, case, device):
    findings = _check_findings("version-counter", case, f"tests.broken_impls:{impl}", device)
    assert findings and all(f.check == "version-counter" and "silently wrong" in f.message for f in findings)


def test_6_version_counter_passes_when_autograd_is_told(device):
    assert _check_findings("version-counter", ROPE, "kernels", device) == []
    assert _check_findings("version-counter", RAW, "kernels", device) == []
    assert _check_findings("version-counter", RAW, "hf", device) == []


def test_determinism_catches_a_sum_whose_order_changes_between_runs(device):
    """Each run is as accurate as HF (the verdict passes it); only a second run shows other bits."""
    case = Case("rms_norm", "llama", "float32", {"lead": [64], "cols": 40}, "contiguous", "normal",
                {"eps": 1e-6, "weight": "same"}, seed=3)
    findings = _check_findings("deterministic", case, "tests.broken_impls:nondeterministic_dw", device)
    assert [(f.check, f.tensor) for f in findings] == [("deterministic", "dW")], findings
    assert run_case("rms_norm", case, load("tests.broken_impls:nondeterministic_dw"), device).passed


@pytest.mark.parametrize("case", [RMS, ROPE, SWIGLU, FG, RAW], ids=lambda c: c.op)
def test_determinism_passes_for_the_kernels(case, device):
    assert _check_findings("deterministic", case, "kernels", device) == []


def test_4_guard_bands_are_wide_enough_for_a_whole_head_group_overrun(device):
    """A head loop one group too far writes group x seq x head_dim elements past Q: inside the guard
    margins, a finding; with the old 256-byte margins it corrupted the heap and the process died."""
    findings = _main_run_findings(ROPE, "tests.broken_impls:rope_overruns_head_group", device)
    hit = [f for f in findings if f.check == "guard-band" and f.tensor == "Q"]
    assert hit and "offset 384" in hit[0].message, findings  # right after Q's 2 x 4 x 3 x 16 elements
    assert not _main_run_findings(ROPE, "kernels", device)


@pytest.mark.parametrize("shape, dtype", [((3, 4097), torch.float32), ((1, 1), torch.bfloat16), ((5, 7), torch.float16)])
def test_guarded_tensors_start_as_aligned_as_allocated_ones(shape, dtype, device):
    """Wide margins must not move a tensor off the alignment a real allocation has: Triton compiles
    another kernel for a less aligned pointer, and the GPU baseline's bits would drift with it."""
    home = GuardedTensor(shape, dtype, device)
    assert (home.tensor.data_ptr() - home.buffer.data_ptr()) % MARGIN_BYTES == 0
    assert home.start * home.buffer.element_size() >= min(home.tensor.numel() * home.buffer.element_size(),
                                                           MARGIN_CAP_BYTES)
