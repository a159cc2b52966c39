"""What the built-in ops needed of ``Op`` and every declaration now has (oracle/declare/op.py): split
dims (RMSNorm's one to three leading dims), params and values per variant, a dtype drawn per case,
grids of points taken as written, pinned regressions and float64 cases, a reference that takes
``compute``. Each feature is shown doing its job, and a bug it exists to expose is caught while the
reference itself passes."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.cases import CPU_BUDGET, Case
from oracle.declare import Choice, DeclarationError, Dim, Op, Tensor
from oracle.declare.implementations import Implementation
from oracle import DtypeChoice, PerVariant
from oracle.declare.registry import SPECS
from oracle.engine import run_case

CPU = torch.device("cpu")


def _scaled_rows(X, W, shift):
    """A row norm scaled by W (shifted by ``shift``), in W's promoted dtype: a toy RMSNorm."""
    h = X.float()
    out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * (W.float() + shift)
    return out.to(torch.promote_types(X.dtype, W.dtype))


def _norm(**changes) -> Op:
    fields = dict(
        reference=_scaled_rows, outputs=("Y",), variants=("plain", "shifted"),
        inputs={"X": Tensor("lead", "cols"),
                "W": Tensor("cols", dtype=DtypeChoice("weight", same="case", float32="float32"),
                            values=PerVariant(plain="weight", shifted="small"))},
        dims={"lead": Dim(1, 4096, programs="rows", split=3), "cols": Dim(1, 512, special=(1, 7, 129))},
        params={"shift": PerVariant(plain=0.0, shifted=1.0)},
    )
    return Op("scaled_rows_declared_here", **(fields | changes))


def _hf(op: Op) -> Implementation:
    return Implementation("hf", SimpleNamespace(**{op.name: op.spec.contract_callable()}))


def _impl(op: Op, fn) -> Implementation:
    return Implementation("broken", SimpleNamespace(**{op.name: fn}))


# --- split dims --------------------------------------------------------------------------------------


def test_a_split_dim_is_recorded_as_a_list_and_held_as_that_many_dims():
    op = _norm()
    short, long = op.spec.stratified("float32", CPU_BUDGET)[:2]
    assert short.dims["lead"] == [3, 5] and len(long.dims["lead"]) == 1 and long.dims["lead"][0] > 64
    args = op.spec.make_args(Case.from_json(short.to_json()), CPU)  # through JSON: lists stay lists
    assert args["X"].shape == (3, 5, short.dims["cols"]) and args["W"].shape == (short.dims["cols"],)
    assert op.spec.long(long) and not op.spec.long(short)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data())
def test_drawn_cases_split_the_programs_within_the_room_the_other_sizes_leave(data):
    """1 to 3 leading sizes whose product fits the programs budget and the elements the columns
    leave: wide rows come few at a time, in every case."""
    op = _norm()
    case = data.draw(op.spec.cases(CPU_BUDGET))
    lead = case.dims["lead"]
    assert isinstance(lead, list) and 1 <= len(lead) <= 3 and min(lead) >= 1
    rows = math.prod(lead)
    if op.spec.long(case):
        assert rows * case.dims["cols"] <= CPU_BUDGET.long_elements
    else:
        assert rows <= CPU_BUDGET.programs and rows * case.dims["cols"] <= CPU_BUDGET.elements


def test_a_split_programs_dim_is_judged_on_a_slice_of_its_flattened_rows():
    op = _norm(scale=({"lead": [4, 8], "cols": 16},))
    programs = op.spec.programs
    case = op.spec.scale()[0]
    assert programs.unit == "rows" and programs.size(case) == (32, 32 * 16)
    assert programs.summed_gradients == ("dW",)
    args = op.spec.make_args(case, CPU)
    index = torch.tensor([0, 9, 31])
    sliced = programs.args(args, index)
    assert torch.equal(sliced["X"], args["X"].reshape(32, 16)[index]) and sliced["W"] is args["W"]
    Y = op.spec.call(op.reference, args)[0]
    assert torch.equal(programs.tensor(Y, index), Y.reshape(32, 16)[index])


def test_a_kernel_that_takes_only_the_first_leading_dim_as_rows_is_caught():
    """Leading dims of a 3-D input merged wrongly (the norm taken over the last two dims): split
    dims put such inputs in every run; the reference passes the same cases."""
    op = _norm()

    def over_two_dims(X, W, shift):
        rows = X.reshape(X.shape[0], -1) if X.dim() > 2 else X
        h = rows.float()
        normed = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).reshape(X.shape)
        return (normed * (W.float() + shift)).to(torch.promote_types(X.dtype, W.dtype))

    case = op.spec.stratified("float32", CPU_BUDGET)[0]  # lead [3, 5]
    assert run_case(op.spec, case, _hf(op), CPU).passed
    assert not run_case(op.spec, case, _impl(op, over_two_dims), CPU).passed


# --- per variant, and a dtype drawn per case --------------------------------------------------------


def test_a_per_variant_param_is_passed_by_the_variant_and_never_recorded():
    op = _norm()
    cases = op.spec.stratified("float32", CPU_BUDGET) + op.spec.sweep(False)
    assert all("shift" not in c.params for c in cases) and {c.variant for c in cases} == {"plain", "shifted"}
    for case in cases[:4]:
        args = op.spec.make_args(case, CPU)
        assert args["shift"] == {"plain": 0.0, "shifted": 1.0}[case.variant]
        mean = float(args["W"].double().mean())
        assert abs(mean - (1.0 if case.variant == "plain" else 0.0)) < 0.2  # the variant's kind of values


def test_a_dtype_choice_is_recorded_by_its_name_and_makes_the_tensor():
    op = _norm()
    cases = op.spec.stratified("bfloat16", CPU_BUDGET)
    assert {c.params["weight"] for c in cases} == {"same", "float32"}
    assert {(c.params["weight"], op.spec.long(c)) for c in cases} >= {("same", False), ("float32", False),
                                                                      ("same", True), ("float32", True)}
    assert {(c.params["weight"], c.variant) for c in cases} == {("same", "plain"), ("float32", "plain"),
                                                                ("same", "shifted"), ("float32", "shifted")}
    for case in cases:
        W = op.spec.make_args(case, CPU)["W"]
        assert W.dtype == (torch.float32 if case.params["weight"] == "float32" else torch.bfloat16)
    older = Case(op.name, "plain", "bfloat16", {"lead": [2], "cols": 8})  # made before the choice: its first
    assert op.spec.make_args(older, CPU)["W"].dtype == torch.bfloat16
    assert all(op.spec.make_args(c, CPU)["W"].dtype == torch.float64 for c in op.spec.float64_cases)


def test_a_kernel_that_rounds_a_float32_weight_to_the_inputs_dtype_is_caught():
    op = _norm()

    def rounds_weight(X, W, shift):
        return _scaled_rows(X, W.to(X.dtype), shift).to(torch.promote_types(X.dtype, W.dtype))

    case = Case(op.name, "plain", "bfloat16", {"lead": [4, 3], "cols": 129}, params={"weight": "float32"}, seed=3)
    assert run_case(op.spec, case, _hf(op), CPU).passed
    assert not run_case(op.spec, case, _impl(op, rounds_weight), CPU).passed
    same = Case(op.name, "plain", "bfloat16", {"lead": [4, 3], "cols": 129}, params={"weight": "same"}, seed=3)
    assert run_case(op.spec, same, _impl(op, rounds_weight), CPU).passed  # no float32 weight: no bug


# --- grids of points, pinned cases, float64 cases ----------------------------------------------------


def test_a_grid_of_points_is_taken_as_written():
    points = ({"dims": {"lead": [2, 3], "cols": 7}, "layout": "offset", "values": "zero_rows",
               "params": {"weight": "float32"}},
              {"dims": {"lead": [300], "cols": 16}, "grad_layout": "broadcast", "dtypes": ("float32",)})
    op = _norm(sweep=points, dtypes=("float32", "bfloat16"))
    cases = op.spec.sweep(False)
    assert [(c.variant, c.dtype, c.layout, c.grad_layout) for c in cases] == [
        ("plain", "float32", "offset", "contiguous"), ("plain", "float32", "contiguous", "broadcast"),
        ("plain", "bfloat16", "offset", "contiguous"),
        ("shifted", "float32", "offset", "contiguous"), ("shifted", "float32", "contiguous", "broadcast"),
        ("shifted", "bfloat16", "offset", "contiguous")]
    assert [c.seed for c in cases] == list(range(6))
    assert cases[0].params == {"weight": "float32"} and cases[1].params == {"weight": "same"}


def test_pinned_regressions_and_float64_cases_are_built_from_dicts():
    op = _norm(regressions=({"variant": "shifted", "dtype": "float16", "dims": {"lead": [1], "cols": 1}, "seed": 4},),
               float64_cases=({"dims": {"lead": [2, 3], "cols": 5}, "layout": "transposed"},))
    pinned, = op.spec.regressions
    assert pinned == Case(op.name, "shifted", "float16", {"lead": [1], "cols": 1}, params={"weight": "same"}, seed=4)
    f64, = op.spec.float64_cases
    assert (f64.dtype, f64.variant, f64.layout) == ("float64", "plain", "transposed")
    assert f64.dims == {"lead": [2, 3], "cols": 5}
    assert run_case(op.spec, pinned, _hf(op), CPU).passed


def test_rms_norm_is_an_op_declaration_with_its_error_inputs_unchanged():
    from oracle.ops import rms_norm

    assert isinstance(rms_norm.RMS_NORM, Op) and rms_norm.SPECS == (rms_norm.RMS_NORM,)
    assert SPECS["rms_norm"] is rms_norm.RMS_NORM.spec and SPECS["rms_norm"].takes_compute
    assert [e.description for e in SPECS["rms_norm"].error_inputs()] == [e.description for e in rms_norm._errors()]
    assert not hasattr(rms_norm, "rms_norm_cases") and not hasattr(rms_norm, "rms_norm_stratified")


def test_a_reference_that_takes_compute_is_its_own_float64_truth():
    def upcasting(X, compute=torch.float32):
        return torch.softmax(X.to(compute), -1).to(X.dtype)

    op = Op("softmax_with_compute_here", reference=upcasting, inputs={"X": Tensor("rows", "cols")},
            dims={"rows": Dim(1, 8), "cols": Dim(1, 64)})
    assert op.spec.takes_compute
    assert not Op("softmax_without_compute_here", reference=lambda X: torch.softmax(X, -1),
                  inputs={"X": Tensor("rows", "cols")}, dims={"rows": Dim(1, 8), "cols": Dim(1, 64)}).spec.takes_compute
    case = op.spec.float64_cases[0]
    assert run_case(op.spec, op.spec.stratified("float16", CPU_BUDGET)[0], _hf(op), CPU).passed
    assert case.dtype == "float64"


# --- mistakes, named ----------------------------------------------------------------------------------


MALFORMED = {
    "a factor on a split dim": (dict(inputs={"X": Tensor("lead", ("cols", 1)), "W": Tensor(("lead", 2))}),
                                r"inputs\['W'\].dims: \('lead', 2\): a split dim \('lead'\) takes no factor"),
    "a split dim with a low": (dict(dims={"lead": Dim(2, 64, split=2), "cols": Dim()}),
                               r"dims\['lead'\]: a split dim takes low=1 and multiple=1"),
    "a split of zero": (dict(dims={"lead": Dim(split=0), "cols": Dim()}), r"dims\['lead'\]: split=0 must be an int"),
    "a split dim's size as an int": (dict(sweep=({"lead": 3, "cols": 7},)), r"sweep: sizes must be positive ints"),
    "too many parts": (dict(sweep=({"lead": [1, 2, 3, 4], "cols": 7},)), r"sweep: sizes must be positive ints"),
    "a PerVariant missing a variant": (dict(params={"shift": PerVariant(plain=0.0)}),
                                       r"params\['shift'\]: PerVariant must give every variant \(plain, shifted\)"),
    "values missing a variant": (dict(inputs={"X": Tensor("lead", "cols"), "W": Tensor("cols", values=PerVariant(
        plain="weight"))}), r"inputs\['W'\].values: PerVariant must give every variant"),
    "a DtypeChoice naming a param": (dict(inputs={"X": Tensor("lead", "cols"), "W": Tensor(
        "cols", dtype=DtypeChoice("shift", same="case"))}), r"DtypeChoice's param 'shift' must be an identifier"),
    "an integer DtypeChoice": (dict(inputs={"X": Tensor("lead", "cols"), "W": Tensor(
        "cols", dtype=DtypeChoice("w", same="case", ints="int32"))}), r"choices are 'case' or floating dtypes"),
    "a point with an unknown key": (dict(sweep=({"dims": {"lead": [3], "cols": 7}, "colour": "red"},)),
                                    r"sweep: a point's keys are some of dims, .* got \['colour'\]"),
    "points mixed with sizes": (dict(sweep=({"dims": {"lead": [3], "cols": 7}}, {"lead": [3], "cols": 7})),
                                r"sweep: either every entry is a point"),
    "a point's unknown layout": (dict(sweep=({"dims": {"lead": [3], "cols": 7}, "layout": "diagonal"},)),
                                 r"sweep: layout must be one of contiguous"),
    "a regression without dims": (dict(regressions=({"variant": "plain"},)), r"regressions: each case gives dims"),
    "a regression's unrecorded param": (
        dict(regressions=({"dims": {"lead": [1], "cols": 1}, "params": {"shift": 1.0}},)),
        r"regressions: params names \['shift'\], which the case does not record"),
    "a float64 case with a dtype": (
        dict(float64_cases=({"dims": {"lead": [1], "cols": 1}, "dtype": "float32"},)),
        r"float64_cases: each case gives dims and any of variant, layout, .* got .*'dtype'"),
    "a partial hand-written model": (dict(noise={"Y": lambda a, u: 0}), r"noise: a hand-written model covers every "),
    "order noise of no tensor": (dict(order_noise={"dZ": lambda a, u: 0}), r"order_noise: names \['dZ'\]"),
}


@pytest.mark.parametrize("what", MALFORMED)
def test_a_malformed_use_of_the_new_fields_is_refused_naming_the_field(what):
    changes, message = MALFORMED[what]
    with pytest.raises(DeclarationError, match=message):
        _norm(**changes)


def test_variants_as_names_are_variants_fixing_nothing():
    op = _norm(params={"eps": Choice(1e-6, 1e-5)}, inputs={"X": Tensor("lead", "cols"), "W": Tensor("cols")},
               reference=lambda X, W, eps: X * W)
    assert op.variants == {"plain": {}, "shifted": {}}
