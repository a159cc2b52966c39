"""Declaring an op (oracle/declare/op.py) and finding declarations (oracle/declare/registry.py): malformed
declarations are refused naming the field, a declared op runs through the engine like a built-in
one (HF passes, a planted bug fails), and the registry finds modules and refuses twins. Every
misuse is a DeclarationError (one class) naming the field, what was given and what is expected:
the declaration's fields, implementation()'s keywords, a module of declarations that cannot be
imported (pytest's usage error, the tools' exit 2)."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from oracle import declare
from oracle.declare import implementations as impls
from oracle.declare import registry
from oracle.cases import CPU_BUDGET, Case
from oracle.declare import Choice, DeclarationError, Dim, Fixed, Integers, Op, Tensor, from_module
from oracle.engine import run_case
from oracle.declare.implementations import Implementation, implementation
from oracle.declare.registry import SPECS

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parent.parent


def _softmax(**changes) -> Op:
    fields = dict(reference=lambda X: torch.softmax(X, -1), inputs={"X": Tensor("rows", "cols")},
                  dims={"rows": Dim(1, 300, programs=True), "cols": Dim(1, 512, special=(1, 7, 129))}, outputs=("Y",))
    return Op("softmax_declared_here", **(fields | changes))


MALFORMED = {
    "the name": (dict(), "op name must be a Python identifier", "1softmax"),
    "an unknown dim": (dict(inputs={"X": Tensor("rows", "width")}), r"inputs\['X'\].dims: 'width' is not one of dims", None),
    "an unknown kind of values": (dict(inputs={"X": Tensor("rows", "cols", values="gaussian")}),
                                  r"inputs\['X'\].values: 'gaussian' is none of", None),
    "not a Tensor": (dict(inputs={"X": ("rows", "cols")}), r"inputs\['X'\]: must be an oracle.declare.Tensor", None),
    "a bad Dim": (dict(dims={"rows": Dim(4, 2), "cols": Dim()}), r"dims\['rows'\]: needs 1 <= low <= high", None),
    "an integer input as differentiable": (
        dict(inputs={"X": Tensor("rows", "cols"), "i": Tensor("rows", dtype=torch.int64, values=Integers(0, 4))},
             differentiable=("X", "i")),
        r"differentiable: 'i' is not a floating input", None),
    "a variant fixing an unknown param": (dict(variants={"a": {"axis": 0}}),
                                          r"variants\['a'\]: fixes \['axis'\], which are not params", None),
    "may_clobber naming no input": (dict(may_clobber=("Y",)), r"may_clobber: 'Y' is not an input", None),
    "an unknown dtype": (dict(dtypes=("float8",)), "dtypes: must be some of", None),
    "a sweep missing a dim": (dict(sweep=({"rows": 3},)), "sweep: each entry must give every dim", None),
    "a scale grid without programs": (dict(dims={"rows": Dim(), "cols": Dim()}, scale=({"rows": 8, "cols": 8},)),
                                      "scale: a scale grid needs a Dim with programs=True", None),
    "noise for a tensor not compared": (dict(noise={"dZ": lambda a, u: 0}), r"noise: names \['dZ'\]", None),
    "a multiple with no size in range": (dict(dims={"rows": Dim(), "cols": Dim(3, 5, multiple=8)}),
                                         r"dims\['cols'\]: multiple=8 leaves no size in \[3, 5\]", None),
    "a scaled dim with a bad factor": (dict(inputs={"X": Tensor("rows", ("cols", 0))}),
                                      r"inputs\['X'\].dims: \('cols', 0\) must be a dim's name", None),
    "a scaled unknown dim": (dict(inputs={"X": Tensor("rows", ("width", 2))}),
                             r"inputs\['X'\].dims: 'width' is not one of dims", None),
    "special sizes off the multiple": (dict(dims={"rows": Dim(), "cols": Dim(2, 64, special=(2, 7), multiple=2)}),
                                       r"dims\['cols'\]: special sizes \[7\] are not multiples of 2", None),
    # Misuses a declaration once took silently: the op would run with a meaning its author did not give it.
    "outputs as one string": (dict(outputs="Y"), r"outputs: must be a tuple of output names, got the string 'Y'; "
                                                 r"for one name write \('Y',\)", None),
    "may_clobber as one string": (dict(may_clobber="X"),
                                  r"may_clobber: must be a tuple of input names, got the string 'X'", None),
    "differentiable as one string": (dict(differentiable="X"),
                                     r"differentiable: must be a tuple of input names, got the string 'X'", None),
    "an integer tensor with floating values": (
        dict(inputs={"X": Tensor("rows", "cols"), "i": Tensor("rows", dtype=torch.int64)}),
        r"inputs\['i'\].values: 'case' draws floating values, and the dtype is torch.int64: an integer or boolean "
        r"tensor takes Integers\(low, high\) or a callable", None),
    "an integer tensor with a parameter's values": (
        dict(inputs={"X": Tensor("rows", "cols"), "i": Tensor("rows", dtype="int32", values="weight")}),
        r"inputs\['i'\].values: 'weight' draws floating values, and the dtype is torch.int32", None),
    "a dtype that is no dtype": (dict(inputs={"X": Tensor("rows", "cols", dtype="relu")}),
                                 r"inputs\['X'\].dtype: 'relu' is not a torch dtype", None),
    "a tuple param of one value": (dict(params={"dim": (-1,)}),
                                   r"params\['dim'\]: the bare tuple \(-1,\) is ambiguous .* write Fixed\(\(-1,\)\) "
                                   r"to pass the tuple itself, or Choice\(...\)", None),
    "a Choice of nothing": (dict(params={"dim": Choice()}), r"params\['dim'\]: Choice\(\) needs at least one value", None),
    "a variant fixing a Choice": (dict(params={"dim": Choice(-1, 1)}, variants={"a": {"dim": Choice(-1, 1)}}),
                                  r"variants\['a'\]\['dim'\]: a variant fixes one value \(passed as it is\), got "
                                  r"Choice\(values=\(-1, 1\)\)", None),
    "a sweep as one dict": (dict(sweep={"rows": 3, "cols": 7}),
                            r"sweep: must be a tuple of dicts \(one per point of the grid\), got one dict; write "
                            r"\(\{'rows': 3, 'cols': 7\},\)", None),
    "a sweep size that is no size": (dict(full_sweep=({"rows": 3, "cols": 0},)),
                                     r"full_sweep: sizes must be positive ints, .* got \{'cols': 0\}", None),
    "Integers bounded by no dim": (
        dict(inputs={"X": Tensor("rows", "cols"), "t": Tensor("rows", dtype=torch.int64, values=Integers(0, "vocab"))}),
        r"inputs\['t'\].values: Integers bound 'vocab' is not one of dims \(rows, cols\)", None),
}


@pytest.mark.parametrize("what", MALFORMED)
def test_a_malformed_declaration_is_refused_naming_the_field(what):
    changes, message, name = MALFORMED[what]
    with pytest.raises(DeclarationError, match=message):
        if name is not None:
            Op(name, reference=lambda X: X, inputs={"X": Tensor("n")}, dims={"n": Dim()})
        else:
            _softmax(**changes)


def test_a_declared_op_is_judged_like_a_built_in_one():
    """HF's own maths passes every stratified case; a softmax rounded through bfloat16 fails."""
    spec = _softmax().spec
    assert spec.noise == {} and not spec.takes_compute  # the derived model judges it
    hf = Implementation("hf", SimpleNamespace(**{spec.name: spec.contract_callable()}))
    bad = Implementation("bf16", SimpleNamespace(
        **{spec.name: lambda X: torch.softmax(X.to(torch.bfloat16).float(), -1).to(X.dtype)}))
    for dtype in ("float32", "float16"):
        cases = spec.stratified(dtype, CPU_BUDGET)
        assert {spec.long(c) for c in cases} == {True, False}
        for case in cases[:4]:
            assert run_case(spec, case, hf, CPU).passed
        assert not run_case(spec, cases[0], bad, CPU).passed


def test_cases_fit_the_budget_and_draw_integers_inside_their_dims():
    op = Op("cross_entropy_declared_here", reference=lambda z, t: F.cross_entropy(z.float(), t),
            inputs={"z": Tensor("n", "vocab"), "t": Tensor("n", dtype=torch.int64, values=Integers(0, "vocab", {-100: 0.5}))},
            dims={"n": Dim(1, 4096, programs=True), "vocab": Dim(2, 128256, special=(128256,))}, outputs=("loss",))
    for case in op.spec.stratified("float32", CPU_BUDGET):
        args = op.spec.make_args(case, CPU)
        assert args["z"].numel() <= max(CPU_BUDGET.elements, CPU_BUDGET.long_elements)
        target = args["t"]
        assert bool(((target >= 0) & (target < case.dims["vocab"]) | (target == -100)).all())
    assert op.spec.programs is None  # no scale grid: nothing is judged on a slice


def test_every_size_of_a_dim_with_a_multiple_is_one():
    """A head dim rotated in halves: drawn, stratified, swept and shrunk to fit, always even."""
    from hypothesis import given, settings

    op = _softmax(dims={"rows": Dim(1, 300, programs=True), "cols": Dim(2, 4095, special=(2, 128, 1000), multiple=2)})
    sizes = [case.dims["cols"] for case in op.spec.stratified("float32", CPU_BUDGET)]
    sizes += [case.dims["cols"] for case in op.spec.sweep(False) + op.spec.sweep(True)]

    @settings(max_examples=60, database=None, derandomize=True)
    @given(op.spec.cases(CPU_BUDGET, ("float32",)))
    def drawn(case):
        sizes.append(case.dims["cols"])

    drawn()
    assert sizes and all(size % 2 == 0 and 2 <= size <= 4095 for size in sizes), sorted(set(sizes))
    assert len(set(sizes)) > 3
    assert Dim(1, 7).fit(100) == 7 and Dim(3, 9, multiple=4).fit(1) == 4 and Dim(3, 9, multiple=4).fit(9) == 8


def test_a_dim_scaled_by_a_factor_keeps_tensors_consistent():
    """x's last dim twice the tables' (RoPE's halves), whatever size each case draws."""
    op = Op("rotate_halves_declared_here", reference=lambda x, c: x * c.repeat(1, 2),
            inputs={"x": Tensor("rows", ("half", 2)), "c": Tensor("rows", "half", values="weight")},
            dims={"rows": Dim(1, 64, programs=True), "half": Dim(1, 64, special=(1, 40))}, outputs=("y",))
    for case in op.spec.stratified("float32", CPU_BUDGET) + op.spec.sweep(False):
        args = op.spec.make_args(case, CPU)
        assert args["x"].shape[-1] == 2 * args["c"].shape[-1] == 2 * case.dims["half"]


def test_a_kernelbench_problem_becomes_a_declaration():
    class Model(torch.nn.Module):
        def __init__(self, n_in, n_out):
            super().__init__()
            self.linear = torch.nn.Linear(n_in, n_out)

        def forward(self, x):
            return torch.relu(self.linear(x))

    op = from_module("kb_linear_relu", Model, lambda: [torch.randn(4, 12)], lambda: [12, 5])
    assert list(op.inputs) == ["x0", "linear_weight", "linear_bias"]
    assert op.grads == ("x0", "linear_weight", "linear_bias")
    case = op.spec.stratified("float32", CPU_BUDGET)[0]
    args = op.spec.make_args(case, CPU)
    assert tuple(args["linear_weight"].shape) == (5, 12)
    hf = Implementation("hf", SimpleNamespace(kb_linear_relu=op.spec.contract_callable()))
    assert run_case(op.spec, case, hf, CPU).passed


def test_the_registry_finds_a_module_refuses_twins_and_names_what_is_wrong(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_LOADED", set())
    monkeypatch.setattr(registry, "ORIGINS", {})
    monkeypatch.setenv(registry.ENVIRONMENT, "")
    (tmp_path / "my_decls.py").write_text(textwrap.dedent('''
        import torch
        from oracle.declare import Dim, Op, Tensor
        DOUBLE = Op("double_it_declared", reference=lambda X: 2 * X, inputs={"X": Tensor("n")}, dims={"n": Dim()})
        ALIAS = DOUBLE  # one declaration under two names counts once
    '''))
    (tmp_path / "twin_decls.py").write_text(textwrap.dedent('''
        from oracle.declare import Dim, Op, Tensor
        TWIN = Op("double_it_declared", reference=lambda X: X + X, inputs={"X": Tensor("n")}, dims={"n": Dim()})
    '''))
    (tmp_path / "empty_decls.py").write_text("x = 1\n")
    try:
        assert registry.load_op_modules(["my_decls"]) == ["double_it_declared"]
        assert "double_it_declared" in SPECS and registry.ORIGINS["double_it_declared"] == "my_decls"
        assert registry.load_op_modules(["my_decls"]) == []  # loaded once
        with pytest.raises(registry.DeclarationError, match="declared twice: in my_decls and in twin_decls"):
            registry.load_op_modules(["twin_decls"])
        with pytest.raises(registry.DeclarationError, match="holds no declaration"):
            registry.load_op_modules(["empty_decls"])
        with pytest.raises(registry.DeclarationError, match="cannot import it"):
            registry.load_op_modules(["no_such_module_here"])
    finally:
        SPECS.pop("double_it_declared", None)
        for name in ("my_decls", "twin_decls", "empty_decls"):
            sys.modules.pop(name, None)


def test_implementation_declares_the_rest_lacking_and_refuses_unknown_ops():
    impl = Implementation("mine", implementation(rms_norm=lambda X, W, eps, gemma=False: X))
    assert impl.select() == ["rms_norm"]
    misspelt = implementation(rmsnorm=lambda X: X)  # checked when the harness loads it, not here
    with pytest.raises(DeclarationError, match=r"implementation\(rmsnorm=...\): 'rmsnorm' is not a registered op \(did "
                                               r"you mean 'rms_norm'\?\); the registry's ops are geglu, "):
        Implementation("misspelt", misspelt)


def test_clobbers_outside_what_the_op_allows_are_refused():
    impl = Implementation("writes X", implementation(rms_norm=lambda X, W, eps, gemma=False: X,
                                                     CLOBBERS={"rms_norm": {"X"}}))
    with pytest.raises(ValueError, match=r"CLOBBERS\['rms_norm'\] = \['X'\], which the op does not allow"):
        impl.select()
    assert SPECS["rope"].may_clobber == ("Q", "K")


# --- every misuse is a named error ------------------------------------------------------------------


def _times(X, W):
    """X * W in float32 at least (W float32 beside X in the case's dtype), rounded to X's dtype."""
    wide = torch.promote_types(X.dtype, torch.float32)
    return (X.to(wide) * W.to(wide)).to(X.dtype)


class _HalfWeightGradient(torch.autograd.Function):
    """``_times`` with dW half what it is."""

    @staticmethod
    def forward(ctx, X, W):
        ctx.save_for_backward(X, W)
        return _times(X, W)

    @staticmethod
    def backward(ctx, dY):
        X, W = ctx.saved_tensors
        wide = torch.promote_types(X.dtype, torch.float32)
        return _times(dY, W), (0.5 * (dY.to(wide) * X.to(wide)).sum(0)).to(W.dtype)


def _float32_weight(**changes) -> Op:
    fields = dict(reference=_times,
                  inputs={"X": Tensor("rows", "cols"), "W": Tensor("cols", dtype="float32", values="weight")},
                  dims={"rows": Dim(1, 64, programs=True), "cols": Dim(1, 256, special=(1, 7, 129))}, outputs=("Y",))
    return Op("times_a_float32_weight_here", **(fields | changes))


def test_every_floating_input_is_differentiable_by_default_a_fixed_float32_one_too():
    """A float32 weight beside bfloat16 activations: its gradient is compared (a dW half what it is
    fails), float64 cases hold it in float64 (gradcheck passes on HF's maths), and only
    ``differentiable=`` leaves it out."""
    op = _float32_weight()
    assert op.grads == ("X", "W") and op.spec.differentiable == ("X", "W")
    hf = Implementation("hf", SimpleNamespace(**{op.name: op.spec.contract_callable()}))
    bad = Implementation("half dW", SimpleNamespace(**{op.name: _HalfWeightGradient.apply}))
    case = op.spec.stratified("bfloat16", CPU_BUDGET)[0]
    args = op.spec.make_args(case, CPU)
    assert (args["X"].dtype, args["W"].dtype) == (torch.bfloat16, torch.float32)
    assert run_case(op.spec, case, hf, CPU).passed
    result = run_case(op.spec, case, bad, CPU)
    assert not result.passed and "dW" in result.explain()

    wide = op.spec.float64_cases[0]
    args = op.spec.make_args(wide, CPU)
    assert args["W"].dtype == args["X"].dtype == torch.float64
    leaves = [args[n].detach().clone().requires_grad_() for n in op.grads]
    assert torch.autograd.gradcheck(op.reference, leaves, fast_mode=True)

    assert _float32_weight(differentiable=("X",)).grads == ("X",)
    assert _float32_weight(differentiable=()).spec.differentiable == ()


def test_a_param_is_a_value_a_choice_or_a_fixed_tuple():
    """``Fixed((-1,))`` is passed as the tuple it is, in every case and through a case's JSON;
    ``Choice`` (and the older bare tuple of several values) is drawn; a plain value is passed."""
    seen = []

    def reference(X, dims, eps, legacy, plain):
        seen.append((dims, eps, legacy, plain))
        return torch.softmax(X, dim=dims[0])

    op = _softmax(reference=reference, params={"dims": Fixed((-1,)), "eps": Choice(1e-5, 1e-6), "legacy": (1, 2),
                                               "plain": 3})
    cases = op.spec.stratified("float32", CPU_BUDGET) + op.spec.sweep(False) + op.spec.sweep(True)
    assert {c.params["dims"] for c in cases} == {(-1,)} and {c.params["plain"] for c in cases} == {3}
    assert {c.params["eps"] for c in cases} == {1e-5, 1e-6} and {c.params["legacy"] for c in cases} == {1, 2}
    again = Case.from_json(cases[1].to_json())
    assert op.spec.make_args(again, CPU)["dims"] == (-1,)
    hf = Implementation("hf", SimpleNamespace(**{op.name: op.spec.contract_callable()}))
    assert run_case(op.spec, again, hf, CPU).passed
    assert seen and all(dims == (-1,) for dims, *_ in seen)
    fixed_by_a_variant = _softmax(reference=lambda X, dims: torch.softmax(X, dims[0]), params={"dims": Fixed((-1,))},
                                  variants={"last": {}, "also_last": {"dims": Fixed((1,))}})
    assert {c.variant: c.params["dims"] for c in fixed_by_a_variant.spec.sweep(False)} == \
        {"last": (-1,), "also_last": (1,)}


def test_lists_where_tuples_belong_are_kept_as_tuples():
    op = _softmax(outputs=["Y"], may_clobber=["X"], dtypes=["float32"], sweep=[{"rows": 3, "cols": 7}])
    assert (op.outputs, op.may_clobber, op.dtypes, op.sweep) == (("Y",), ("X",), ("float32",), ({"rows": 3, "cols": 7},))


def test_implementation_takes_every_attribute_an_implementation_declares():
    """CLOBBERS, LACKING, NO_FLOAT64, EXACT_MATHS and COMPILES pass through (COMPILES was once refused as
    "unknown op(s) COMPILES"); every attribute the harness reads off an implementation is one of
    them; anything else upper-case, or a value of the wrong form, is refused by name."""
    from oracle.checks import compile as compile_check

    def rms_norm(X, W, eps, gemma=False):
        return X

    impl = Implementation("mine", implementation(rms_norm=rms_norm, CLOBBERS={"rms_norm": set()},
                                                 LACKING={"rope": "next release"}, NO_FLOAT64={"rms_norm"},
                                                 EXACT_MATHS={"rms_norm"}, COMPILES=True))
    assert impl.select() == ["rms_norm"] and impl.op("rms_norm") is rms_norm
    assert not impl.takes_float64("rms_norm") and impl.maths("rms_norm") == "exact"
    assert compile_check.declares_compiles(impl, "rms_norm")
    lacking = impl.declared_lacking()
    assert lacking["rope"] == "next release" and lacking["swiglu"] == "not provided by this implementation"
    assert "rms_norm" not in lacking and repr(impl.target).startswith("implementation(rms_norm, CLOBBERS")

    read = set()
    for path in (ROOT / "oracle").rglob("*.py"):
        read |= set(re.findall(r"getattr\((?:self|impl|implementation)\.target, \"([A-Z_0-9]+)\"", path.read_text()))
    assert read and read <= set(impls.ATTRIBUTES), sorted(read - set(impls.ATTRIBUTES))
    assert set(impls.ATTRIBUTES) == {"CLOBBERS", "LACKING", "NO_FLOAT64", "EXACT_MATHS", "SAVED_IN_INPUT_DTYPE", "COMPILES",
                                     "EXACT"}

    refused = {
        "COMPILE": (dict(COMPILE=True), r"implementation\(COMPILE=...\): COMPILE is not an attribute an implementation "
                                        r"declares \(did you mean COMPILES\?\); those are CLOBBERS, LACKING"),
        "a string of ops": (dict(NO_FLOAT64="rms_norm"), r"implementation\(NO_FLOAT64=...\): must be a collection of "
                                                         r"the ops without a float64 path, got 'rms_norm' \(a string is "
                                                         r"not split into names"),
        "a string of clobbers": (dict(CLOBBERS={"rms_norm": "X"}), r"implementation\(CLOBBERS=...\): must be a dict "
                                                                   r"of op -> the argument names .* got \{'rms_norm': 'X'\}"),
        "COMPILES as a number": (dict(COMPILES=1), r"implementation\(COMPILES=...\): must be True, False or a "
                                                   r"collection .* got 1"),
        "an op that is no callable": (dict(rope=None), r"implementation\(rope=...\): an op must be callable, got "
                                                       r"NoneType None"),
        "an op given and lacking": (dict(LACKING={"rms_norm": "no"}), r"implementation\(LACKING=...\): rms_norm is "
                                                                      r"given as an op and declared lacking"),
    }
    for what, (keywords, message) in refused.items():
        with pytest.raises(DeclarationError, match=message):
            implementation(rms_norm=rms_norm, **keywords)
            pytest.fail(what)
    misnamed = implementation(rms_norm=rms_norm, CLOBBERS={"rmsnorm": {"X"}})  # op names: checked when loaded
    with pytest.raises(DeclarationError, match=r"implementation\(CLOBBERS=...\): 'rmsnorm' is not a registered op "
                                               r"\(did you mean 'rms_norm'\?\)"):
        Implementation("misnamed", misnamed)


def test_implementation_checks_its_op_names_when_the_harness_loads_it(tmp_path, monkeypatch):
    """A module of implementations imports before its ops are declared (no try/except); loaded by
    the harness, an op that is still unknown is an error naming it; a plain script registers the
    declarations with load_declarations, and then the same module loads and runs."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_LOADED", set())
    monkeypatch.setattr(registry, "ORIGINS", {})
    monkeypatch.setattr(registry, "_ENTRY_POINTS_LOADED", True)
    monkeypatch.setenv(registry.ENVIRONMENT, "")
    # The module holds no Triton kernel: import it plainly, whatever the interpreter's state here.
    monkeypatch.setattr(impls.interpreter, "prepare_for", importlib.import_module)
    (tmp_path / "lazy_decls.py").write_text(textwrap.dedent('''
        from oracle.declare import Dim, Op, Tensor
        DOUBLE = Op("lazy_double_declared", reference=lambda X: 2 * X, inputs={"X": Tensor("n")}, dims={"n": Dim()})
    '''))
    (tmp_path / "lazy_impls.py").write_text(textwrap.dedent('''
        from oracle.declare.implementations import implementation
        impl = implementation(lazy_double_declared=lambda X: X + X, CLOBBERS={"lazy_double_declared": ()})
        misspelt = implementation(lazy_dubble_declared=lambda X: X + X)
    '''))
    try:
        import lazy_impls  # noqa: F401 - imports although its ops are not declared yet

        assert "lazy_double_declared" not in SPECS
        with pytest.raises(DeclarationError, match=r"lazy_impls:impl: implementation\(lazy_double_declared=...\): "
                                                   r"'lazy_double_declared' is not a registered op.*load_declarations"):
            impls.load("lazy_impls:impl")
        assert registry.load_declarations("lazy_decls") == ["lazy_double_declared"]
        assert registry.load_declarations("lazy_decls") == ["lazy_double_declared"]  # loaded once, named again
        impl = impls.load("lazy_impls:impl")
        assert impl.select(["lazy_double_declared"]) == ["lazy_double_declared"]
        assert "lazy_double_declared" not in impl.declared_lacking() and "rope" in impl.declared_lacking()
        spec = SPECS["lazy_double_declared"]
        assert run_case(spec, spec.stratified("float32", CPU_BUDGET)[0], impl, CPU).passed
        with pytest.raises(DeclarationError, match=r"implementation\(lazy_dubble_declared=...\): 'lazy_dubble_declared' "
                                                   r"is not a registered op \(did you mean 'lazy_double_declared'\?\)"):
            impls.load("lazy_impls:misspelt")
        with pytest.raises(DeclarationError, match=r"load_declarations: each argument is a module's name"):
            registry.load_declarations(["lazy_decls"])
    finally:
        SPECS.pop("lazy_double_declared", None)
        registry._WHERE.pop("lazy_double_declared", None)
        impls.load.cache_clear()
        for name in ("lazy_decls", "lazy_impls"):
            sys.modules.pop(name, None)


BROKEN_MODULES = {
    "malformed_decls": ("from oracle.declare import Dim, Op, Tensor\n"
                        "BAD = Op(\"bad_declared\", reference=lambda X: X, inputs={\"X\": Tensor(\"rows\")}, dims={})\n",
                        r"op module malformed_decls: op 'bad_declared': inputs\['X'\].dims: 'rows' is not one of dims "
                        r"\(none declared\) \(at .*malformed_decls.py:2\)"),
    "raising_decls": ("import torch\nraise RuntimeError('no GPU here')\n",
                      r"op module raising_decls: importing it raised RuntimeError: no GPU here \(at .*raising_decls.py:2\)"),
    "needy_decls": ("import not_a_package_anyone_has\n",
                    r"op module needy_decls: cannot import it: No module named 'not_a_package_anyone_has' "
                    r"\(at .*needy_decls.py:1\)"),
    "late_decls": ("from oracle.declare import Dim, Op, Tensor\n"
                   "LATE = Op('late_declared', reference=lambda X: X, inputs={'X': Tensor('cols', 'rows')},\n"
                   "          dims={'rows': Dim(programs=True), 'cols': Dim()}, scale=({'rows': 8, 'cols': 8},))\n",
                   r"op module late_decls: op 'late_declared': scale: the programs dim 'rows' must come first"),
}


def _broken_modules(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_LOADED", set())
    monkeypatch.setattr(registry, "ORIGINS", {})
    monkeypatch.setattr(registry, "_ENTRY_POINTS_LOADED", True)
    monkeypatch.setenv(registry.ENVIRONMENT, "")
    for name, (text, _) in BROKEN_MODULES.items():
        (tmp_path / f"{name}.py").write_text(text)


def test_anything_wrong_in_an_op_module_is_one_declaration_error_naming_it(tmp_path, monkeypatch):
    """One error class, whatever went wrong (not only an ImportError) and wherever it was found: a
    malformed Op, any exception while importing, a missing dependency, a spec that cannot be built,
    each named with the module and the line."""
    assert registry.DeclarationError is declare.DeclarationError and issubclass(DeclarationError, ValueError)
    _broken_modules(tmp_path, monkeypatch)
    try:
        for name, (_, message) in BROKEN_MODULES.items():
            with pytest.raises(registry.DeclarationError, match=message):
                registry.load_op_modules([name])
            assert name not in registry._LOADED
    finally:
        for name in BROKEN_MODULES:
            sys.modules.pop(name, None)


def test_a_broken_op_module_is_a_usage_error_of_every_tool(tmp_path, monkeypatch, capsys):
    """pytest: a usage error (exit 4); the report and the repro command: exit 2 with the message; no
    traceback from any of them."""
    from oracle import repro
    from oracle.report import __main__ as report

    _broken_modules(tmp_path, monkeypatch)
    case = _softmax().spec.stratified("float32", CPU_BUDGET)[0].to_json()
    try:
        assert repro.main([case, "--impl", "hf", "--op-module", "raising_decls"]) == 2
        assert report.main(["--impl", "hf", "--op-module", "malformed_decls"]) == 2
    finally:
        for name in BROKEN_MODULES:
            sys.modules.pop(name, None)
    out, err = capsys.readouterr()
    assert "error: op module raising_decls: importing it raised RuntimeError: no GPU here" in err
    assert "error: op module malformed_decls: op 'bad_declared': inputs['X'].dims" in " ".join(out.split())
    assert "Traceback" not in out + err

    env = {k: v for k, v in os.environ.items() if k not in (registry.ENVIRONMENT, "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    # -p: the plugin, as an installed harness registers it (the GPU machine runs the checkout on PYTHONPATH)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "oracle.pytest_plugin", "-q",
                           "--pyargs", "oracle.suite",
                           "--impl", "hf", "--op-module", "malformed_decls"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ERROR: op module malformed_decls: op 'bad_declared': inputs['X'].dims: 'rows' is not one of dims" in \
        proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
