"""The kernels inside torch.compile graphs (kernels/_library.py), and the harness's compile check.

- Every ``kernel_oracle`` custom op passes ``torch.library.opcheck`` on representative inputs in
  every dtype (the public ones on their specs' cases), and each public op's schema mutates exactly
  what ``kernels.CLOBBERS`` declares.
- Tiny patched Hugging Face models (Llama, Gemma 3; tests/test_models.py's, one layer) compile with
  ``fullgraph=True``: graph breaks counted before (the kernels fenced off by torch.compiler.disable,
  as they were) and after (none); compiled as the check compiles (``aot_eager``, oracle/checks/compile.py,
  Note [The backend]) they train with the eager patched model's bits: logits, loss and every
  gradient at each step, parameters after SGD steps. With Inductor they compile whole and pass the
  verdict against HF.
- The compile check (oracle/checks/compile.py) catches each planted bug of tests/broken_impls.py,
  notes the graph breaks of an implementation that does not declare COMPILES, and passes the
  kernels and ``--impl hf``.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

import kernels
from kernels import _runtime, patching
from oracle.checks import aliasing
from oracle.checks import compile as compile_check
from oracle.cases import Case
from oracle.declare.implementations import Implementation, load
from oracle.declare.registry import SPECS
from oracle.suite.test_contract import BUDGET, aliasing_examples
from tests.test_aliasing import RAW, ROPE, SWIGLU
from tests import test_models
from tests.one_thread import one_torch_thread  # noqa: F401 (autouse: one torch thread per test)
from tests.test_models import batch, tiny_model

ON_CPU = _runtime.interpreted()
OPS = torch.ops.kernel_oracle
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


# --- opcheck of every custom op -----------------------------------------------------------------


def _tensor(*shape, dtype, gen, grad=False, device="cpu"):
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).to(device).requires_grad_(grad)


def _rms_norm_backward_inputs(dtype, gen, device):
    out = []
    for gemma, weight in ((False, dtype), (True, torch.float32)):  # Llama; Gemma with an fp32 W, X transposed
        X, W = _tensor(3, 5, 40, dtype=dtype, gen=gen, device=device), _tensor(40, dtype=weight, gen=gen, device=device)
        X = X.transpose(0, 1) if gemma else X
        _, inv_var = OPS.rms_norm(X, W, 1e-6, gemma)
        out.append((_tensor(*X.shape, dtype=X.dtype, gen=gen, device=device), X, W, inv_var, gemma, not gemma))
    return out


def _rope_rotated_inputs(dtype, gen, device):
    Q = _tensor(2, 4, 3, 16, dtype=dtype, gen=gen, grad=True, device=device)
    K = _tensor(2, 2, 3, 16, dtype=dtype, gen=gen, grad=True, device=device)
    cos = _tensor(8, 16, dtype=torch.float32, gen=gen, device=device)
    sin = _tensor(8, 16, dtype=torch.float32, gen=gen, device=device)
    positions = torch.tensor([[0, 1, 2], [5, 6, 7]], device=device)
    return [(Q, K, cos, sin, positions, False), (Q, K, cos, sin, None, True)]


def _gated_backward_inputs(dtype, gen, device, *options):
    dh, e, g = (_tensor(3, 70, dtype=dtype, gen=gen, device=device) for _ in range(3))
    # aligned; a stride-0 gradient, as .sum() hands backward; e column-major
    return [(dh, e, g, *options), (dh[:1].expand(3, 70), e, g, *options), (dh, e.t().contiguous().t(), g, *options)]


# The ops behind the public ones' backwards (and RoPE's compiled path): no spec calls them, so their
# inputs are made here. The public ops are opchecked on their specs' cases, as the compile check does.
INNER_OPS = {
    "rms_norm_backward": _rms_norm_backward_inputs,
    "rope_rotated": _rope_rotated_inputs,
    "swiglu_backward": _gated_backward_inputs,
    "geglu_backward": lambda dtype, gen, device: _gated_backward_inputs(dtype, gen, device, "none") +
    _gated_backward_inputs(dtype, gen, device, "tanh")[:1],
}


def _public_op(name: str):
    return compile_check.custom_op_of(getattr(kernels, name))


def test_every_custom_op_of_the_kernels_is_opchecked():
    registered = {name for name in torch._C._dispatch_get_all_op_names() if name.startswith("kernel_oracle::")}
    checked = {_public_op(name)._schema.name for name in SPECS} | {f"kernel_oracle::{name}" for name in INNER_OPS}
    assert registered == checked


def _representative_cases(spec, dtype: str) -> list[Case]:
    """Every variant, in a short stratified case of the dtype, or the float64 cases."""
    if dtype == "float64":
        return list(spec.float64_cases)
    short = [c for c in spec.stratified(dtype, BUDGET) if not spec.long(c)]
    return [next(c for c in short if c.variant == variant) for variant in spec.variants]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("name", SPECS)
def test_opcheck_passes_for_every_public_op(name, dtype, device):
    """Schema (no undeclared mutation or aliasing), autograd registration, fake tensors against the
    real outputs, and AOTAutograd with dynamic shapes, on the spec's cases (compile_check's binding)."""
    spec = SPECS[name]
    for case in _representative_cases(spec, dtype):
        assert compile_check.opcheck_findings(spec, case, _public_op(name), device) == [], case.label


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", INNER_OPS)
def test_opcheck_passes_for_every_inner_op(name, dtype, device):
    gen = torch.Generator().manual_seed(0)
    for args in INNER_OPS[name](dtype, gen, device):
        results = torch.library.opcheck(getattr(OPS, name), args, raise_exception=False)
        assert all(r == "SUCCESS" for r in results.values()), results


@pytest.mark.parametrize("name", SPECS)
def test_each_public_op_is_a_custom_op_mutating_exactly_its_clobbers(name):
    op = compile_check.custom_op_of(getattr(kernels, name))
    assert op is not None and op.namespace == "kernel_oracle", name
    assert compile_check.mutated_arguments(op) == kernels.CLOBBERS[name]


def test_rope_under_compile_rotates_in_place_and_tells_autograd(device):
    """The compiled path (rope_rotated and copy_ back, Note [RoPE under torch.compile]) on views of a
    fused projection: Q and K rotated in their buffer, V untouched, gradients the eager ones."""
    gen = torch.Generator().manual_seed(3)
    cos = _tensor(5, 8, dtype=torch.float32, gen=gen, device=device)
    sin = _tensor(5, 8, dtype=torch.float32, gen=gen, device=device)
    leaf = _tensor(2, 3, 6 * 8 + 2 * 8 + 16, dtype=torch.float32, gen=gen, grad=True, device=device)
    upstream = _tensor(2, 3, 6 * 8 + 2 * 8 + 16, dtype=torch.float32, gen=gen, device=device)

    def step(leaf):
        fused = leaf * 1.0  # a projection's output: a non-leaf, so rotating its views in place is legal
        Q = fused[..., :48].view(2, 3, 6, 8).transpose(1, 2)
        K = fused[..., 48:64].view(2, 3, 2, 8).transpose(1, 2)
        kernels.rope(Q, K, cos, sin)
        return fused

    eager_leaf, compiled_leaf = (leaf.detach().clone().requires_grad_() for _ in range(2))
    eager = step(eager_leaf)
    compiled = torch.compile(step, fullgraph=True, backend=compile_check.BACKEND)(compiled_leaf)
    assert torch.equal(compiled, eager) and torch.equal(compiled[..., 64:], leaf[..., 64:].detach())
    eager.backward(upstream)
    compiled.backward(upstream)
    assert torch.equal(compiled_leaf.grad, eager_leaf.grad)


# --- compiled models ------------------------------------------------------------------------------


# One decoder layer (tests/test_models.py's tiny models have two): what is tested is compilation, and
# every further layer only repeats the same graph on the interpreter's time.
LAYERS = 1


def small_model(arch: str, dtype: torch.dtype, device) -> torch.nn.Module:
    """tests/test_models.py's tiny model with LAYERS decoder layers (its SIZE holds the count)."""
    with mock.patch.dict(test_models.SIZE, num_hidden_layers=LAYERS):
        return tiny_model(arch, dtype, device)


def fence_off_the_kernels(monkeypatch) -> None:
    """What patch_model installed before the kernels were custom ops: each kernel behind
    torch.compiler.disable, a graph break per call."""
    monkeypatch.setattr(patching, "rms_norm", torch.compiler.disable(kernels.rms_norm))
    monkeypatch.setattr(patching, "rope", torch.compiler.disable(kernels.rope))
    fenced = tuple(dataclasses.replace(p, op=torch.compiler.disable(p.op)) for p in patching.mlp_patches())
    monkeypatch.setattr(patching, "mlp_patches", lambda: fenced)


def graph_breaks(model, inputs) -> tuple[int, list[str]]:
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(**inputs)
    return explained.graph_break_count, sorted({b.reason.splitlines()[0] for b in explained.break_reasons})


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_patched_model_compiles_without_graph_breaks(arch, device, monkeypatch):
    inputs = batch("packed", device)
    model = small_model(arch, torch.float32, device)
    with patched_model(model):
        after, reasons = graph_breaks(model, inputs)
    with monkeypatch.context() as fenced:
        fence_off_the_kernels(fenced)
        with patched_model(model):
            before, before_reasons = graph_breaks(model, inputs)
    print(f"{arch}: {before} graph breaks with the kernels fenced off ({before_reasons}), {after} as custom ops")
    assert after == 0, reasons
    # at least one break per patched norm (the layer's two and the final one)
    assert before >= 2 * LAYERS + 1 and any("disable" in r for r in before_reasons), before_reasons


def patched_model(model):
    return patching.patched(model)


def _run(model, call, inputs) -> dict[str, torch.Tensor]:
    """forward_backward through ``call`` (the model or its compiled wrapper), gradients read from
    the model's own parameters (a compiled wrapper prefixes their names)."""
    model.zero_grad(set_to_none=True)
    out = call(**inputs)
    out.loss.backward()
    return {"logits": out.logits.detach(), "loss": out.loss.detach().reshape(1),
            **{f"grad {n}": p.grad for n, p in model.named_parameters() if p.grad is not None}}


def _different(a: dict, b: dict) -> list[str]:
    assert a.keys() == b.keys()
    return [name for name in a if not torch.equal(a[name], b[name])]


@pytest.mark.parametrize("arch, dtype, kind", [("llama", torch.float32, "packed"), ("gemma3", torch.float32, "padded"),
                                               ("llama", torch.bfloat16, "packed")], ids=str)
def test_a_compiled_patched_model_trains_with_the_eager_bits(arch, dtype, kind, device):
    """Two training steps (forward, backward, SGD) of a patched model, eager and compiled: the same
    logits, loss and gradient of every parameter at each step, the same parameters after them."""
    inputs = batch(kind, device)
    eager_model = small_model(arch, dtype, device)
    compiled_model = copy.deepcopy(eager_model)
    with patched_model(eager_model), patched_model(compiled_model):
        torch._dynamo.reset()
        runs = {"eager": (eager_model, eager_model),
                "compiled": (compiled_model, torch.compile(compiled_model, fullgraph=True, backend=compile_check.BACKEND))}
        optimizers = {name: torch.optim.SGD(model.parameters(), lr=0.1) for name, (model, _) in runs.items()}
        for step in range(2):
            got = {name: _run(model, call, inputs) for name, (model, call) in runs.items()}
            assert _different(got["eager"], got["compiled"]) == [], f"step {step}"
            assert len(got["eager"]) == 2 + len(list(eager_model.parameters()))  # logits, loss, every gradient
            for optimizer in optimizers.values():
                optimizer.step()
    assert _different(dict(eager_model.named_parameters()), dict(compiled_model.named_parameters())) == []


def inductor_ready() -> None:
    """Keep Inductor's CPU code generation to what the machine's ATen was built for. Under
    ATEN_CPU_CAPABILITY=default, Inductor has been seen to emit vectorised at::vec code anyway, whose
    C++ compile then fails ("'at::vec' has not been declared"); its scalar path (simdlen 1) is what
    that capability means. (Not reproduced with torch 2.13 on this AVX-512 machine, where both
    settings compile: the setting is the cause's remedy, kept in this one place.)"""
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        torch._inductor.config.cpp.simdlen = 1


# float32 matmuls stay float32 on purpose: TF32 would change HF's maths the verdict is judged against
@pytest.mark.filterwarnings("ignore:TensorFloat32 tensor cores for float32 matrix multiplication:UserWarning")
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_patched_model_compiles_whole_with_inductor_and_matches_hf(arch, device):
    """Inductor generates its own code for everything around the kernels (softmax, the loss), so
    its bits are not eager's (Note [The backend]); the compiled patched model is judged by the
    verdict instead, as tests/test_models.py judges a patched model (Note [Judging a whole model]):
    k the compiled patched model, h HF in eager mode, the truth and noise of HF's own model."""
    inductor_ready()
    inputs = batch("packed", device)
    base = small_model(arch, torch.float32, device)
    h = _run(base, base, inputs)
    ref = test_models.reference(base, inputs)
    mine = copy.deepcopy(base)
    # in this process: a pool of compile workers, each importing torch, costs more on two CPU cores
    with patched_model(mine), torch._inductor.config.patch(compile_threads=1):
        torch._dynamo.reset()
        k = _run(mine, torch.compile(mine, fullgraph=True), inputs)
    assert test_models.failures(k, h, ref) == []


# --- the harness's compile check -----------------------------------------------------------------


def _findings(impl, case, device):
    return aliasing.run_check("compile", SPECS[case.op], case, impl, device)


def _notes_of(action) -> list[str]:
    """The compile notes ``action()`` takes, taken back out of NOTES: a planted graph break here is
    not one for the session's summary to list."""
    start = len(compile_check.NOTES)
    try:
        action()
        return [note.describe() for note in compile_check.NOTES[start:]]
    finally:
        del compile_check.NOTES[start:]


def _fresh(impl: Implementation, case: Case, device):
    """The check run afresh (not the once-per-key answer), with the notes it took. A note is never a
    warning (oracle/checks/compile.py, Note [Notes])."""
    findings = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        notes = _notes_of(lambda: findings.extend(compile_check.run(SPECS[case.op], case, impl, device)))
    assert not [w for w in caught if any(note in str(w.message) for note in notes)], caught
    return findings, notes


@pytest.mark.parametrize("impl", ["kernels", "hf"])
def test_the_compile_check_passes_the_kernels_and_hf(impl, device):
    """One short case per op (the bf16 pinned example of each spec's first variant): no failure and
    no note, so every op compiles whole (HF's raw backwards are custom ops, as the kernels' are:
    torch.autograd.grad inside them was a graph break)."""
    def every_op():
        for spec in SPECS.values():
            case = next(c for c in aliasing_examples(spec) if c.dtype == "bfloat16")
            assert _findings(load(impl), case, device) == [], spec.name

    assert _notes_of(every_op) == []


def test_an_op_whose_schema_omits_a_mutation_fails(device):
    findings, _ = _fresh(load("tests.broken_impls:schema_omits_a_mutation"), RAW, device)
    schema = {f.tensor for f in findings if f.phase == "schema"}
    assert schema == {"e", "g"} and all("does not mark it mutated" in f.message for f in findings if f.phase == "schema")
    assert any(f.phase == "opcheck" and "test_schema" in f.message for f in findings), findings
    assert _fresh(load("kernels"), RAW, device) == ([], [])


def test_a_graph_break_fails_an_implementation_that_declares_compiles(device):
    broken = load("tests.broken_impls:graph_break_declaring_compiles")
    findings, notes = _fresh(broken, ROPE, device)
    assert [f.phase for f in findings] == ["compile"] and "graph break" in findings[0].message, findings
    assert "declares COMPILES" in findings[0].message and not notes
    # the same function without the declaration: a note with the reason, not a failure
    undeclared = Implementation("rope-without-COMPILES", SimpleNamespace(rope=broken.target.rope, CLOBBERS=kernels.CLOBBERS))
    findings, notes = _fresh(undeclared, ROPE, device)
    assert findings == [] and len(notes) == 1 and "graph break" in notes[0]
    assert _fresh(load("kernels"), ROPE, device) == ([], [])


def test_a_compiled_result_that_differs_from_eager_fails(device):
    case = dataclasses.replace(SWIGLU, dtype="bfloat16")
    findings, _ = _fresh(load("tests.broken_impls:compiled_differs_from_eager"), case, device)
    assert {f.tensor for f in findings} == {"h", "de", "dg"}, findings
    assert all("other bits than in eager mode" in f.message for f in findings)
    assert _fresh(load("kernels"), case, device) == ([], [])


def test_the_kernels_as_they_were_get_a_note_and_fail_only_when_they_claim_to_compile(device):
    """Each kernel fenced off by torch.compiler.disable (as before the custom ops): a graph break,
    noted with its reason; declared COMPILES, a failure."""
    fenced = {op: torch.compiler.disable(getattr(kernels, op)) for op in SPECS}
    before = Implementation("kernels-fenced-off", SimpleNamespace(**fenced, CLOBBERS=kernels.CLOBBERS))
    findings, notes = _fresh(before, SWIGLU, device)
    assert findings == [] and len(notes) == 1 and "torch.compiler.disable" in notes[0], notes
    claims = Implementation("kernels-fenced-off-claiming", SimpleNamespace(**fenced, CLOBBERS=kernels.CLOBBERS,
                                                                         COMPILES=True))
    findings, _ = _fresh(claims, SWIGLU, device)
    assert len(findings) == 1 and "graph break" in findings[0].message


def test_the_check_runs_once_per_op_variant_and_dtype(device):
    """A second case of the same op, variant and dtype gets the first one's findings, saying where
    they were found (oracle/checks/compile.py, Note [Once per op, variant and dtype])."""
    impl = load("tests.broken_impls:compiled_differs_from_eager")
    first = dataclasses.replace(SWIGLU, dtype="float16", seed=101)
    second = dataclasses.replace(first, dims={"shape": [2, 5]}, seed=102)
    found = _findings(impl, first, device)
    again = _findings(impl, second, device)
    assert found and [f.tensor for f in again] == [f.tensor for f in found]
    assert all(f"found on {first.label}" in f.message for f in again)


# --- --impl compile: a graph for every case -------------------------------------------------------


def _graphs_of(fn, inputs) -> int:
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    for x in inputs:
        fn(x)
    return counters["stats"]["unique_graphs"] - before


def test_the_compile_implementation_compiles_every_case_and_never_falls_back_to_eager():
    """Past dynamo's default of 8 recompiles of one function, torch.compile runs it eagerly with one
    log line (oracle/bench/workload.py, compile_every_case): ``--impl compile`` then judged HF's eager code.
    Twelve ranks are twelve graphs once the implementation is loaded, and a limit that is reached
    anyway is an error, not eager code."""
    import torch._dynamo

    load("compile")
    ranks = [torch.ones([2] * rank) for rank in range(1, 13)]
    assert _graphs_of(torch.compile(lambda x: x * 2, backend="eager", dynamic=True), ranks) == 12
    with mock.patch.object(torch._dynamo.config, "recompile_limit", 2):
        limited = torch.compile(lambda x: x * 3, backend="eager", dynamic=True)
        with pytest.raises(Exception, match="recompile_limit"):
            _graphs_of(limited, ranks)


def test_dynamos_default_falls_back_to_eager_after_eight_graphs():
    """The other side: at dynamo's defaults the ninth rank on runs eagerly, silently (what the test
    above rules out)."""
    import torch._dynamo

    ranks = [torch.ones([2] * rank) for rank in range(1, 13)]
    with mock.patch.object(torch._dynamo.config, "recompile_limit", 8), \
            mock.patch.object(torch._dynamo.config, "fail_on_recompile_limit_hit", False):
        assert _graphs_of(torch.compile(lambda x: x * 5, backend="eager", dynamic=True), ranks) == 8
