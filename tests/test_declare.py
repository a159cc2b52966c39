"""Declaring an op (oracle/declare.py) and finding declarations (oracle/registry.py): malformed
declarations are refused naming the field, a declared op runs through the engine like a built-in
one (HF passes, a planted bug fails), and the registry finds modules and refuses twins."""

from __future__ import annotations

import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from oracle import registry
from oracle.cases import CPU_BUDGET
from oracle.declare import DeclarationError, Dim, Integers, Op, Tensor, from_module
from oracle.engine import run_case
from oracle.impls import Implementation, implementation
from oracle.ops import SPECS

CPU = torch.device("cpu")


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
        dict(inputs={"X": Tensor("rows", "cols"), "i": Tensor("rows", dtype=torch.int64)}, differentiable=("X", "i")),
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
    with pytest.raises(ValueError, match="unknown op"):
        implementation(rmsnorm=lambda X: X)


def test_clobbers_outside_what_the_op_allows_are_refused():
    impl = Implementation("writes X", implementation(rms_norm=lambda X, W, eps, gemma=False: X,
                                                     CLOBBERS={"rms_norm": {"X"}}))
    with pytest.raises(ValueError, match=r"CLOBBERS\['rms_norm'\] = \['X'\], which the op does not allow"):
        impl.select()
    assert SPECS["rope"].may_clobber == ("Q", "K")
