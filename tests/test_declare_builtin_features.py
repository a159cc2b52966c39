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


# --- per-row dims (an element-wise op's shape), a raw kernel's hf, trailing params left out ------------


def _gated(**changes) -> Op:
    """A toy gated MLP (SwiGLU's maths) over one per-row shape."""
    from oracle.ops.swiglu import swiglu

    fields = dict(reference=swiglu, outputs=("h",), inputs={"e": Tensor("shape", layout=True),
                                                          "g": Tensor("shape", layout=True)},
                  dims={"shape": Dim(1, 2**20, split=3, per_row=True)})
    return Op("gated_declared_here", **(fields | changes))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(data=st.data())
def test_a_per_row_dim_is_drawn_as_rows_by_columns_within_the_budget(data):
    case = data.draw(_gated().spec.cases(CPU_BUDGET))
    shape = case.dims["shape"]
    assert 2 <= len(shape) <= 3 and math.prod(shape) <= CPU_BUDGET.elements


def test_a_per_row_dims_long_stratified_cases_end_in_a_partial_block():
    cases = _gated().spec.stratified("float32", CPU_BUDGET)
    short, long = cases[0::2], cases[1::2]
    assert all(len(c.dims["shape"]) == 2 and math.prod(c.dims["shape"]) <= 1024 for c in short)
    assert all(math.prod(c.dims["shape"]) > 4 * 1024 and math.prod(c.dims["shape"]) % 1024 for c in long)


def test_a_kernel_that_drops_the_last_partial_block_is_caught_on_a_long_case():
    from oracle.ops.swiglu import swiglu

    op = _gated()

    def drops_last_block(e, g):
        h = swiglu(e, g)
        kept = torch.arange(h.numel()).reshape(h.shape) < h.numel() // 1024 * 1024
        return h * kept

    long = op.spec.stratified("float32", CPU_BUDGET)[1]
    assert run_case(op.spec, long, _hf(op), CPU).passed
    assert not run_case(op.spec, long, _impl(op, drops_last_block), CPU).passed


def test_a_per_row_dim_is_judged_at_scale_on_a_slice_of_its_rows():
    op = _gated(scale=({"dims": {"shape": [2, 3, 16]}},))
    programs = op.spec.programs
    case = op.spec.scale()[0]
    assert programs.unit == "rows" and programs.size(case) == (6, 6 * 16) and programs.summed_gradients == ()
    args = op.spec.make_args(case, CPU)
    index = torch.tensor([0, 5])
    sliced = programs.args(args, index)
    assert all(torch.equal(sliced[n], args[n].reshape(6, 16)[index]) for n in ("e", "g"))


def _doubled_into_x(**changes) -> Op:
    """A toy raw kernel: 2x written into x's buffer, outside autograd."""
    def hf(x):
        return x.mul_(2)

    fields = dict(reference=lambda x: 2 * x, inputs={"x": Tensor("n")}, dims={"n": Dim(1, 64)}, outputs=("y",),
                  differentiable=(), may_clobber=("x",), writes_into={"y": "x"}, hf=hf)
    return Op("doubled_into_x_declared_here", **(fields | changes))


def test_a_raw_kernels_hf_is_its_contract_callable_and_a_fresh_result_is_caught():
    """The reference returns a new tensor; the contract writes into x. ``hf`` is what --impl hf
    runs: it passes, and an implementation returning the reference's fresh tensor fails."""
    op = _doubled_into_x()
    assert op.spec.contract_callable() is op.hf
    case = op.spec.stratified("float32", CPU_BUDGET)[0]
    clobbers = {op.name: {"x"}}
    right = Implementation("hf", SimpleNamespace(**{op.name: op.hf, "CLOBBERS": clobbers}))
    fresh = Implementation("fresh", SimpleNamespace(**{op.name: lambda x: 2 * x, "CLOBBERS": clobbers}))
    assert run_case(op.spec, case, right, CPU).passed
    caught = run_case(op.spec, case, fresh, CPU)
    assert not caught.passed and [f.check for f in caught.findings] == ["buffers"]


def test_an_error_input_may_leave_out_trailing_params():
    """GeGLU's shared error inputs give e and g only: the callee's default approximation stands."""
    spec = SPECS["geglu"]
    e, g = torch.randn(3, 4), torch.randn(3, 4)
    assert torch.equal(spec.call(spec.reference, {"e": e, "g": g})[0], spec.reference(e, g, "tanh"))
    assert torch.equal(spec.call(spec.reference, {"e": e, "g": g, "approximate": "none"})[0],
                       spec.reference(e, g, "none"))


def test_the_gated_mlps_are_op_declarations():
    import oracle.ops.geglu as geglu_module
    import oracle.ops.swiglu as swiglu_module

    for op in swiglu_module.SPECS + geglu_module.SPECS:
        assert isinstance(op, Op) and SPECS[op.name] is op.spec and op.spec.error_inputs()
    assert not hasattr(swiglu_module, "OpSpec") and not hasattr(geglu_module, "OpSpec")


PER_ROW_MALFORMED = {
    "per_row unsplit": (dict(dims={"shape": Dim(per_row=True)}), r"dims\['shape'\]: per_row needs split >= 2"),
    "per_row counting programs": (dict(dims={"shape": Dim(split=3, per_row=True, programs=True)}),
                                  r"dims\['shape'\]: per_row needs split >= 2 .* and no programs"),
    "a per-row size of one part": (dict(sweep=({"dims": {"shape": [7]}},)), r"sweep: sizes must be positive ints"),
    "hf not callable": (dict(hf="swiglu"), r"hf: must be callable or None, got str"),
}


@pytest.mark.parametrize("what", PER_ROW_MALFORMED)
def test_a_malformed_per_row_dim_or_hf_is_refused_naming_the_field(what):
    changes, message = PER_ROW_MALFORMED[what]
    with pytest.raises(DeclarationError, match=message):
        _gated(**changes)


# --- RoPE's needs: related dims, unpassed params, packed positions, (batch, heads, seq, head_dim) -------


def _grouped_sum(Q, K):
    """Q plus K's kv heads, each repeated for its group of Q's heads (grouped-query attention)."""
    return Q + K.repeat_interleave(Q.shape[1] // K.shape[1], dim=1)


def _grouped(**changes) -> Op:
    fields = dict(
        reference=_grouped_sum, outputs=("Y",),
        inputs={"Q": Tensor("batch", "heads", "seq", "head_dim"), "K": Tensor("batch", "kv_heads", "seq", "head_dim")},
        dims={"batch": Dim(1, 3), "heads": Dim(1, 12, multiple_of="kv_heads"), "kv_heads": Dim(1, 4),
              "seq": Dim(1, 512, programs="tokens"), "head_dim": Dim(2, 16, multiple=2)},
    )
    return Op("grouped_declared_here", **(fields | changes))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data())
def test_a_multiple_of_dim_is_drawn_as_a_multiple_of_the_other(data):
    op = _grouped()
    case = data.draw(op.spec.cases(CPU_BUDGET))
    assert case.dims["heads"] % case.dims["kv_heads"] == 0 and case.dims["heads"] >= case.dims["kv_heads"]


def test_heads_tiled_in_the_wrong_order_are_caught_on_a_grouped_case():
    """repeat where repeat_interleave belongs: every drawn case is a valid grouping, and this one, of
    two kv heads each shared by two of Q's, exposes the bug; the reference passes it."""
    op = _grouped()
    assert all(c.dims["heads"] % c.dims["kv_heads"] == 0 for c in op.spec.stratified("float32", CPU_BUDGET))

    def tiled(Q, K):
        return Q + K.repeat(1, Q.shape[1] // K.shape[1], 1, 1)

    case = Case(op.name, "default", "float32", {"batch": 1, "heads": 4, "kv_heads": 2, "seq": 3, "head_dim": 4})
    assert run_case(op.spec, case, _hf(op), CPU).passed
    assert not run_case(op.spec, case, _impl(op, tiled), CPU).passed
    ungrouped = Case(op.name, "default", "float32", {"batch": 1, "heads": 2, "kv_heads": 2, "seq": 3, "head_dim": 4})
    assert run_case(op.spec, ungrouped, _impl(op, tiled), CPU).passed  # one head per kv head: no bug


def test_an_at_least_dim_is_never_drawn_below_the_other():
    op = SPECS["rope"]
    cases = op.stratified("float32", CPU_BUDGET) + op.stratified("bfloat16", CPU_BUDGET)
    assert all(c.dims["max_pos"] >= c.dims["seq"] for c in cases)
    assert all(c.dims["heads"] % c.dims["kv_heads"] == 0 for c in cases)


def _filled(shape, dtype, gen, device, params):
    return torch.full(shape, params["base"], dtype=dtype, device=device)


def _scaled(**changes) -> Op:
    fields = dict(
        reference=lambda X, T: X * T, outputs=("Y",),
        inputs={"X": Tensor("rows", "cols"), "T": Tensor("rows", "cols", values=_filled, layout=False)},
        dims={"rows": Dim(1, 8), "cols": Dim(1, 64)}, params={"base": Choice(2.0, 0.5, passed=False)},
        differentiable=("X",),
    )
    return Op("scaled_by_table_declared_here", **(fields | changes))


def test_an_unpassed_choice_is_recorded_and_makes_a_tensor_but_is_not_passed():
    op = _scaled()
    assert op.arg_names == ("X", "T") and op.spec.arg_names == ("X", "T")
    cases = op.spec.stratified("float32", CPU_BUDGET)
    assert {c.params["base"] for c in cases} == {2.0, 0.5}
    for case in cases[:3]:
        args = op.spec.make_args(case, CPU)
        assert "base" not in args and torch.all(args["T"] == case.params["base"])


def test_a_kernel_that_ignores_the_table_is_caught_where_the_params_change_it():
    op = _scaled()

    def doubles(X, T):
        return X * 2.0

    half = Case(op.name, "default", "float32", {"rows": 3, "cols": 5}, params={"base": 0.5})
    two = Case(op.name, "default", "float32", {"rows": 3, "cols": 5}, params={"base": 2.0})
    assert run_case(op.spec, half, _hf(op), CPU).passed
    assert not run_case(op.spec, half, _impl(op, doubles), CPU).passed
    assert run_case(op.spec, two, _impl(op, doubles), CPU).passed  # the table it assumes: no bug


def test_packed_positions_restart_per_row_and_plain_ones_are_left_out():
    from oracle.declare.parts import Positions

    spec = SPECS["rope"]
    packed = Case("rope", "packed", "float32", {"batch": 3, "heads": 2, "kv_heads": 1, "seq": 40, "head_dim": 8,
                                                "max_pos": 40}, seed=5)
    positions = spec.make_args(packed, CPU)["position_ids"]
    assert positions.dtype == torch.int64 and positions.shape == (3, 40)
    steps = positions[:, 1:] - positions[:, :-1]
    assert bool(((steps == 1) | (positions[:, 1:] == 0)).all()) and bool((positions[:, 1:] == 0).any())
    assert not torch.equal(positions[0], positions[1])
    whole = Case(**{**packed.__dict__, "params": {**packed.params, "first_row": "one document"}})
    assert torch.equal(spec.make_args(whole, CPU)["position_ids"][0], torch.arange(40))
    assert spec.make_args(Case(**{**packed.__dict__, "variant": "plain"}), CPU)["position_ids"] is None
    assert torch.equal(Positions.default(2, 3, CPU), torch.tensor([[0, 1, 2], [0, 1, 2]]))


def test_a_rope_that_ignores_packed_positions_is_caught_and_passes_plain_cases():
    from oracle.ops import rope as rope_module

    spec = SPECS["rope"]

    def sequential(Q, K, cos, sin, position_ids=None):
        return rope_module.rope(Q, K, cos, sin, None)

    dims = {"batch": 2, "heads": 4, "kv_heads": 2, "seq": 9, "head_dim": 8, "max_pos": 12}
    packed, plain = (Case("rope", v, "float32", dims, seed=3) for v in ("packed", "plain"))
    hf = Implementation("hf", SimpleNamespace(rope=spec.contract_callable()))
    broken = Implementation("broken", SimpleNamespace(rope=sequential))
    assert run_case(spec, packed, hf, CPU).passed
    assert not run_case(spec, packed, broken, CPU).passed
    assert run_case(spec, plain, broken, CPU).passed


def test_rope_is_sliced_along_its_tokens_with_left_out_positions_made_explicit():
    """At scale a case is judged on some tokens: each token's output must be what the whole case
    gives it. Without position_ids a token's position is its index, which a bare slice would lose."""
    spec = SPECS["rope"]
    programs = spec.programs
    case = Case("rope", "plain", "float32", {"batch": 2, "heads": 4, "kv_heads": 2, "seq": 300, "head_dim": 8,
                                             "max_pos": 300}, "transposed", seed=2)
    args = spec.make_args(case, CPU)
    index = torch.tensor([0, 129, 299])
    assert programs.unit == "tokens" and programs.size(case) == (300, 2 * 4 * 300 * 8)
    sliced = programs.args(args, index)
    assert torch.equal(sliced["position_ids"], index.expand(2, -1)) and sliced["cos"] is args["cos"]
    whole = spec.call(spec.reference, args)
    part = spec.call(spec.reference, sliced)
    assert all(torch.equal(programs.tensor(w, index), p) for w, p in zip(whole, part))
    bare = spec.call(spec.reference, sliced | {"position_ids": None})  # what the slice would give, made bare
    assert not torch.equal(programs.tensor(whole[0], index), bare[0])


def test_layout_bshd_stores_transposed_tensors_as_hf_does_and_fuses_heads():
    from oracle.checks.memory import FUSE_HEADS
    from oracle.declare.spec import layout_bshd

    spec = SPECS["rope"]
    assert spec.layout_of is layout_bshd and spec.fusion is FUSE_HEADS and spec.layout_args == ("Q", "K")
    assert _grouped().spec.fusion is None and _grouped(layout_of=layout_bshd).spec.fusion is FUSE_HEADS
    op = _grouped(layout_of=layout_bshd)

    def reads_storage_as_contiguous(Q, K):
        return _grouped_sum(Q.as_strided(Q.shape, Q.contiguous().stride(), Q.storage_offset()), K)

    case = Case(op.name, "default", "float32", {"batch": 2, "heads": 4, "kv_heads": 2, "seq": 3, "head_dim": 4},
                "transposed")
    assert op.spec.layout_of("transposed", (2, 4, 3, 4)).order == (0, 2, 1, 3)  # (batch, seq, heads, head_dim)
    assert run_case(op.spec, case, _hf(op), CPU).passed
    assert not run_case(op.spec, case, _impl(op, reads_storage_as_contiguous), CPU).passed
    contiguous = Case(**{**case.__dict__, "layout": "contiguous"})
    assert run_case(op.spec, contiguous, _impl(op, reads_storage_as_contiguous), CPU).passed


def test_a_point_naming_variants_is_taken_for_those_alone():
    cases = SPECS["rope"].scale()
    assert {c.dims["batch"] for c in cases if c.variant == "plain"} == {1}
    assert {c.dims["batch"] for c in cases if c.variant == "packed"} == {2}
    assert all(("first_row" in c.params) == (c.variant == "packed") for c in cases)
    assert [c.seed for c in cases] == list(range(len(cases)))


def test_rope_is_an_op_declaration_with_its_error_inputs_unchanged():
    from oracle.ops import rope as rope_module

    assert isinstance(rope_module.ROPE, Op) and rope_module.SPECS == (rope_module.ROPE,)
    assert SPECS["rope"] is rope_module.ROPE.spec and not hasattr(rope_module, "OpSpec")
    assert [e.description for e in SPECS["rope"].error_inputs()] == [e.description for e in rope_module._rope_errors()]


ROPE_MALFORMED = {
    "multiple_of no dim": (dict(dims={"batch": Dim(1, 3), "heads": Dim(1, 12, multiple_of="groups"),
                                      "kv_heads": Dim(1, 4), "seq": Dim(1, 512), "head_dim": Dim(2, 16)}),
                           r"dims\['heads'\]: multiple_of='groups' must name another dim"),
    "at_least itself": (dict(dims={"batch": Dim(1, 3), "heads": Dim(1, 12), "kv_heads": Dim(1, 4),
                                   "seq": Dim(1, 512, at_least="seq"), "head_dim": Dim(2, 16)}),
                        r"dims\['seq'\]: at_least='seq' must name another dim"),
    "floating positions": (dict(inputs={"Q": Tensor("batch", "heads", "seq", "head_dim"),
                                        "K": Tensor("batch", "kv_heads", "seq", "head_dim"),
                                        "P": Tensor("batch", "seq", values=__import__("oracle.declare.parts").declare
                                                    .parts.Positions())}, reference=lambda Q, K, P: Q),
                           r"inputs\['P'\].values: Positions are a \(batch, seq\) tensor of an integer dtype"),
    "a point's unknown variant": (dict(sweep=({"dims": {"batch": 1, "heads": 2, "kv_heads": 1, "seq": 3,
                                                        "head_dim": 4}, "variants": ("packed",)},)),
                                  r"sweep: a point's variants must be some of the op's \(default\)"),
}


@pytest.mark.parametrize("what", ROPE_MALFORMED)
def test_a_malformed_rope_feature_is_refused_naming_the_field(what):
    changes, message = ROPE_MALFORMED[what]
    with pytest.raises(DeclarationError, match=message):
        _grouped(**changes)
