"""The kernels' own tests: a fixed spread of shapes per op and dtype against HF's maths (through the
oracle's verdict, never a hand-picked tolerance), their contracts (public API, in-place writes,
opt-in modes, determinism). The table of bad inputs runs in tests/test_bad_inputs.py."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

import pytest
import torch

import kernels
from kernels import _elementwise, _runtime
from oracle.declare import reference as R
from oracle.declare.registry import SPECS
from oracle.ops import rope as rope_ops, swiglu as swiglu_ops
from oracle.cases import Case
from oracle.verdict import judge
from oracle.engine import run_case
from oracle.declare.implementations import load
from tests.one_thread import one_torch_thread  # noqa: F401 (autouse: one torch thread per test)

DTYPES = ("float32", "float16", "bfloat16")


def _rms(variant, dtype, lead, cols, layout="contiguous", values="normal", weight="same", seed=0):
    return Case("rms_norm", variant, dtype, {"lead": lead, "cols": cols}, layout, values,
                {"eps": 1e-6, "weight": weight}, seed)


def _rope(variant, dtype, batch, heads, kv, seq, head_dim, layout="contiguous", table="float32", seed=0):
    return Case("rope", variant, dtype, {"batch": batch, "heads": heads, "kv_heads": kv, "seq": seq,
                                         "head_dim": head_dim, "max_pos": seq + 9}, layout, "normal",
                {"theta": 10000.0, "rope_type": "default", "table": table}, seed)


def _ew(op, dtype, shape, layout="contiguous", values="normal"):
    return Case(op, "default", dtype, {"shape": shape}, layout, values, {}, seed=3)


SPREAD = [
    *[_rms(v, d, [5], 7) for v in ("llama", "gemma") for d in DTYPES],  # odd columns
    *[_rms(v, d, [9], 1) for v in ("llama", "gemma") for d in DTYPES],  # one column
    # the maximum: each variant in float32 and in one 16-bit dtype, so each dtype is there too. The
    # launch at this width (the measured setting, the 1024 programs that sum dW's partials) depends
    # on the element size alone (pipelining stages), the same for float16 and bfloat16; the code of
    # each variant and dtype pair runs at every narrower width here. ~10 s a case, interpreted.
    *[_rms(v, d, [2], 65536) for v, d in (("llama", "float32"), ("llama", "bfloat16"),
                                          ("gemma", "float32"), ("gemma", "float16"))],
    *[_rms("llama", d, [2, 3], 4097, "strided", weight="float32") for d in DTYPES],  # block boundary, strided rows
    *[_rms("gemma", d, [3, 1, 2], 130, "transposed", "zero_rows") for d in DTYPES],  # transposed, eps-only rows
    *[_rope("plain", d, 2, 6, 2, 5, 80) for d in DTYPES],  # n_heads % 4 != 0, head_dim 80
    *[_rope("packed", d, 2, 6, 3, 4, 96, "transposed", table="model") for d in DTYPES],  # packed, head_dim 96
    *[_rope("packed", d, 3, 8, 1, 3, 128, "offset") for d in DTYPES],  # GQA 8:1, per-row positions
    *[_ew("swiglu", d, [3, 1025], "transposed") for d in DTYPES],
    *[_ew("swiglu_fg_kernel", d, [2, 3, 333]) for d in DTYPES],
    *[_ew("swiglu_DWf_DW_dfg_kernel", d, [7, 150], values="large") for d in DTYPES],
]


@pytest.mark.parametrize("case", SPREAD, ids=lambda c: c.label)
def test_matches_hf_on_a_spread_of_shapes(case, device):
    result = run_case(case.op, case, load("kernels"), device)
    assert result.passed, result.explain()


def test_public_api_is_the_contract():
    """The package exports exactly the registry's ops, CLOBBERS, COMPILES, EXACT_MATHS and EXACT; a raw
    kernel clobbers the buffers its results land in, RoPE rotates Q and K in place, and nothing else
    overwrites an argument; RoPE alone promises HF's bits (tests/test_exact.py), the other ops HF's
    rounding steps for their outputs (tests/test_exact_rounding.py)."""
    assert kernels.__all__ == sorted(["CLOBBERS", "COMPILES", "EXACT", "EXACT_MATHS", *SPECS])
    assert kernels.EXACT["rope"] is True
    assert all(set(promise.values()) == {"rounding"} for op, promise in kernels.EXACT.items() if op != "rope")
    assert set(kernels.CLOBBERS) == set(SPECS)
    for name, spec in SPECS.items():
        expected = {"Q", "K"} if name == "rope" else set(spec.buffers_hold_outputs.values())
        assert kernels.CLOBBERS[name] == expected, name


def refuse_launches(monkeypatch) -> None:
    """From now on, fail the test if any kernel launch starts: every launch goes through _runtime.launching."""
    def refuse():
        raise AssertionError("a kernel was launched")

    # every kernel module that launches (each imports _runtime.launching), so a new one is refused too
    modules = [importlib.import_module(f"kernels.{info.name}") for info in pkgutil.iter_modules(kernels.__path__)]
    launchers = [module for module in modules if hasattr(module, "launching") and module is not _runtime]
    assert launchers, "no kernel module launches through _runtime.launching"
    for module in launchers:
        monkeypatch.setattr(module, "launching", refuse)


@pytest.fixture
def no_launch(monkeypatch):
    refuse_launches(monkeypatch)


# The spec table of bad inputs (raise before any launch, or HF's result) runs in tests/test_bad_inputs.py.


@pytest.mark.skipif(_runtime.interpreted(), reason="on CPU the interpreter accepts CPU tensors by design")
def test_cpu_tensors_are_refused_on_a_gpu_machine(no_launch):
    with pytest.raises(ValueError, match="run on CUDA"):
        kernels.rms_norm(torch.randn(2, 4), torch.randn(4), 1e-6)


def test_zero_rows_return_empty_without_a_launch(device, no_launch):
    X = torch.empty(0, 3, 16, device=device, requires_grad=True)
    W = torch.randn(16, device=device, requires_grad=True)
    Y = kernels.rms_norm(X, W, 1e-6)
    assert Y.shape == (0, 3, 16)
    dX, dW = torch.autograd.grad(Y, (X, W), torch.empty_like(Y))
    assert dX.shape == X.shape and torch.equal(dW, torch.zeros_like(W))
    Q, K = torch.empty(2, 4, 0, 8, device=device), torch.empty(2, 2, 0, 8, device=device)
    assert kernels.rope(Q, K, torch.randn(4, 8, device=device), torch.randn(4, 8, device=device))[0].shape == Q.shape
    e = torch.empty(0, 5, device=device)
    for name, spec in SPECS.items():  # every gated element-wise op, raw or autograd
        if {"e", "g"} <= set(spec.arg_names):
            args = {n: e.clone() for n in spec.arg_names if n in ("DW", "e", "g")}
            assert spec.call(getattr(kernels, name), args)[0].shape == (0, 5), name


def test_rms_norm_dW_is_deterministic(device):
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(37, 300, generator=gen).to(device).requires_grad_()
    W = torch.randn(300, generator=gen).to(device).requires_grad_()
    dY = torch.randn(37, 300, generator=gen).to(device)
    runs = [torch.autograd.grad(kernels.rms_norm(X, W, 1e-6), (X, W), dY) for _ in range(3)]
    for dX, dW in runs[1:]:
        assert torch.equal(dX, runs[0][0]) and torch.equal(dW.view(torch.int32), runs[0][1].view(torch.int32))


def test_write_dx_into_dy_reuses_the_gradient_buffer_and_matches_the_safe_mode(device):
    gen = torch.Generator().manual_seed(1)
    X = torch.randn(6, 70, generator=gen).to(device).requires_grad_()
    W = torch.randn(70, generator=gen).to(device).requires_grad_()
    dY = torch.randn(6, 70, generator=gen).to(device)
    safe_dX, safe_dW = torch.autograd.grad(kernels.rms_norm(X, W, 1e-6), (X, W), dY.clone())
    own = dY.clone()
    dX, dW = torch.autograd.grad(kernels.rms_norm(X, W, 1e-6, write_dx_into_dy=True), (X, W), own)
    assert dX.data_ptr() == own.data_ptr()  # dX lives in the caller's gradient buffer
    assert torch.equal(dX, safe_dX) and torch.equal(dW, safe_dW)
    # .sum() hands a stride-0 gradient: nothing to write into, so the safe path is taken.
    dX_sum, = torch.autograd.grad(kernels.rms_norm(X, W, 1e-6, write_dx_into_dy=True).sum(), X)
    assert torch.equal(dX_sum, torch.autograd.grad(kernels.rms_norm(X, W, 1e-6).sum(), X)[0])


def test_rope_rotates_in_place_and_tells_autograd(device):
    gen = torch.Generator().manual_seed(2)
    base = torch.randn(2, 3, 6 * 8 + 2 * 8, generator=gen).to(device)  # a fused projection: Q then K
    Q = base[..., :48].view(2, 3, 6, 8).transpose(1, 2)
    K = base[..., 48:].view(2, 3, 2, 8).transpose(1, 2)
    cos, sin = torch.randn(5, 8, generator=gen).to(device), torch.randn(5, 8, generator=gen).to(device)
    versions = (Q._version, K._version)
    Q_out, K_out = kernels.rope(Q, K, cos, sin)
    assert Q_out.data_ptr() == Q.data_ptr() and K_out.data_ptr() == K.data_ptr()
    assert Q._version > versions[0] and K._version > versions[1]


def test_calls_with_nothing_to_differentiate_give_the_same_bits_without_a_node(device):
    """No grad mode, or no input that requires grad: no autograd node is built (the host's shortest
    path), the results are the same bits, and RoPE still bumps the version counters."""
    gen = torch.Generator().manual_seed(3)
    X = torch.randn(5, 40, generator=gen).to(device).requires_grad_()
    W = torch.randn(40, generator=gen).to(device).requires_grad_()
    with_node = kernels.rms_norm(X, W, 1e-6)
    with torch.no_grad():
        without = kernels.rms_norm(X, W, 1e-6)
    assert with_node.grad_fn is not None and without.grad_fn is None
    assert torch.equal(with_node.detach(), without)
    Q0, K0 = torch.randn(1, 4, 3, 8, generator=gen).to(device), torch.randn(1, 2, 3, 8, generator=gen).to(device)
    cos, sin = torch.randn(5, 8, generator=gen).to(device), torch.randn(5, 8, generator=gen).to(device)
    Q, K = Q0.clone().requires_grad_().clone(), K0.clone()
    kernels.rope(Q, K, cos, sin)
    with torch.inference_mode():
        Qi, Ki = kernels.rope(Q0.clone(), K0.clone(), cos, sin)
    versions = (Q0._version, K0._version)
    kernels.rope(Q0, K0, cos, sin)
    assert Q.grad_fn is not None and torch.equal(Q.detach(), Qi) and torch.equal(K, Ki)
    assert torch.equal(Q0, Qi) and Q0._version > versions[0] and K0._version > versions[1]


# every raw kernel that writes its results into its arguments' buffers
RAW_BACKWARDS = [getattr(kernels, name) for name, spec in SPECS.items() if spec.buffers_hold_outputs]


@pytest.mark.parametrize("raw_backward", RAW_BACKWARDS, ids=lambda f: f.__name__)
def test_raw_backward_writes_its_buffers_and_bumps_their_versions(raw_backward, device):
    DW, e, g = (torch.randn(4, 9, device=device) for _ in range(3))
    versions = [t._version for t in (DW, e, g)]
    out = raw_backward(DW, e, g)
    assert all(a is b for a, b in zip(out, (DW, e, g)))
    assert all(t._version > v for t, v in zip((DW, e, g), versions))


@pytest.mark.parametrize("raw_backward", RAW_BACKWARDS, ids=lambda f: f.__name__)
def test_raw_backward_treats_tensors_that_require_grad_as_torchs_in_place_ops_do(raw_backward, device):
    """With grad mode on, a leaf that requires grad is refused with torch's own error class and words
    (before anything is written); under no_grad it is written, as torch's in-place ops allow; a
    non-leaf is written and its version bumped, so autograd raises if anything saved it."""
    gen = torch.Generator().manual_seed(5)
    DW, e, g = (torch.randn(4, 9, generator=gen).to(device) for _ in range(3))
    leaf = torch.randn(4, 9, generator=gen).to(device).requires_grad_()
    before = leaf.detach().clone()
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place operation"):
        leaf.mul_(2.0)  # torch's own refusal, for comparison
    with pytest.raises(RuntimeError, match="but e is a leaf Variable that requires grad .*a leaf Variable that "
                                           "requires grad is being used in an in-place operation"):
        raw_backward(DW.clone(), leaf, g.clone())
    assert torch.equal(leaf.detach(), before)
    with torch.no_grad():
        out = raw_backward(DW.clone(), leaf, g.clone())
    assert out[1] is leaf and not torch.equal(leaf.detach(), before)
    non_leaf = before.clone().requires_grad_() * 1.0
    saved = (non_leaf * torch.ones_like(non_leaf, requires_grad=True)).sum()  # saves non_leaf
    raw_backward(DW.clone(), non_leaf, g.clone())
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.backward()


# every raw kernel that returns a new tensor outside autograd
RAW_FORWARDS = [getattr(kernels, name) for name, spec in SPECS.items()
                if not spec.differentiable and not spec.buffers_hold_outputs]


@pytest.mark.parametrize("raw_forward", RAW_FORWARDS, ids=lambda f: f.__name__)
def test_raw_forward_refuses_inputs_that_require_grad_while_grad_mode_is_on(raw_forward, device):
    """Its result has no graph: with grad mode on, e requiring grad would silently get no gradient,
    so it is refused (RuntimeError, as torch refuses what it cannot differentiate); under no_grad, or
    on detached inputs, the same bits as ever, outside autograd."""
    gen = torch.Generator().manual_seed(6)
    e, g = (torch.randn(3, 50, generator=gen).to(device) for _ in range(2))
    expected = raw_forward(e, g)
    e.requires_grad_()
    with pytest.raises(RuntimeError, match="raw kernel outside autograd, and e requires grad"):
        raw_forward(e, g)
    with torch.no_grad():
        h = raw_forward(e, g)
    assert not h.requires_grad and torch.equal(h, expected)
    assert torch.equal(raw_forward(e.detach(), g), expected)


@pytest.mark.parametrize("block", (1024, 2048))
def test_flat_launch_narrows_offsets_only_where_every_block_fits_32_bits(block):
    """32-bit offsets up to the last size whose blocks, rounded up, end below 2**31; no bounds test
    only where blocks tile the tensor exactly."""
    most = 2**31 - block  # the largest tensor whose last block ends below 2**31
    assert -(-most // block) * block - 1 <= 2**31 - 1
    assert _elementwise.flat_launch(most, block) == {"WIDE": False, "EVEN": True}
    assert _elementwise.flat_launch(most + 1, block) == {"WIDE": True, "EVEN": False}
    assert _elementwise.flat_launch(2**31 + 3000, block) == {"WIDE": True, "EVEN": False}  # the test below
    assert _elementwise.flat_launch(3 * block, block) == {"WIDE": False, "EVEN": True}
    assert _elementwise.flat_launch(3 * block + 1, block) == {"WIDE": False, "EVEN": False}


def _flat_ops() -> list[tuple[str, _elementwise.GatedKernels]]:
    """Each declared op whose kernels launch through kernels/_elementwise, with the GatedKernels its
    public function uses by default (a module's first)."""
    found = []
    for name in SPECS:
        if importlib.util.find_spec(f"kernels.{name}") is None:
            continue
        values = vars(importlib.import_module(f"kernels.{name}")).values()
        gated = [k for v in values for k in (v.values() if isinstance(v, dict) else (v,))
                 if isinstance(k, _elementwise.GatedKernels)]
        if gated:
            found.append((name, gated[0]))
    return found


def test_every_flat_op_is_found():
    assert len(_flat_ops()) >= 2


@pytest.mark.parametrize("op,gated", _flat_ops(), ids=lambda x: x if isinstance(x, str) else "")
def test_flat_specialisations_give_the_same_bits(op, gated, device, monkeypatch):
    """Every (WIDE, EVEN) pair a tensor allows computes the same bits, forward and backward: the
    specialisation changes only how offsets are formed and whether they are tested."""
    gen = torch.Generator()
    fn = getattr(kernels, op)
    block = gated.block_size

    def run(n, flags):
        monkeypatch.setattr(_elementwise, "flat_launch", lambda *_: flags)
        gen.manual_seed(n)
        e, g, dh = (torch.randn(n, generator=gen).to(device, torch.bfloat16) for _ in range(3))
        e.requires_grad_(), g.requires_grad_()
        h = fn(e, g)
        return (h, *torch.autograd.grad(h, (e, g), dh))

    for n, evens in ((2 * block, (False, True)), (2 * block + 5, (False,))):
        results = {(wide, even): run(n, {"WIDE": wide, "EVEN": even}) for wide in (False, True) for even in evens}
        first = results[False, False]
        for flags, got in results.items():
            assert all(torch.equal(a, b) for a, b in zip(got, first)), (n, flags)


@pytest.mark.gpu
@pytest.mark.skipif(_runtime.interpreted(), reason="2**31 elements need a GPU (the interpreter would take hours)")
def test_swiglu_offsets_beyond_2_31_elements(device):
    """Elements past 2**31 are addressed right (64-bit offsets): judge the tail of each result."""
    n = 2**31 + 3000
    gen = torch.Generator(device=device).manual_seed(4)
    e, g, DW = (torch.randn(n, device=device, dtype=torch.bfloat16, generator=gen) for _ in range(3))
    tail = slice(n - 5000, n)
    e_tail, g_tail, dw_tail = e[tail].clone(), g[tail].clone(), DW[tail].clone()

    h = kernels.swiglu_fg_kernel(e, g)
    verdict = judge("h", h[tail], swiglu_ops.swiglu(e_tail, g_tail), R.truth(swiglu_ops.swiglu, e_tail, g_tail))
    assert verdict.passed, verdict
    del h

    kernels.swiglu_DWf_DW_dfg_kernel(DW, e, g)
    expected = swiglu_ops.swiglu_lora_backward(dw_tail, e_tail, g_tail)
    truth = R.truth(swiglu_ops.swiglu_lora_backward, dw_tail, e_tail, g_tail)
    for name, got, hf, t in zip(("h", "df", "de"), (DW[tail], e[tail], g[tail]), expected, truth):
        verdict = judge(name, got, hf, t)
        assert verdict.passed, verdict


@pytest.mark.skipif(_runtime.interpreted() or not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_rope_with_positions_is_captured_in_a_cuda_graph(device):
    """The per-call range check reads nothing to the host, which capture forbids: its device-side
    assertion is the rotation kernel's own, captured with it, and the replayed graph rotates exactly
    as an eager call does."""
    gen = torch.Generator().manual_seed(0)
    cos, sin = rope_ops.rotary_table(64, 16, device=device)
    Q0, K0 = torch.randn(2, 4, 8, 16, generator=gen).to(device), torch.randn(2, 2, 8, 16, generator=gen).to(device)
    positions = rope_ops.packed_positions(2, 8, gen).to(device)
    expected = kernels.rope(Q0.clone(), K0.clone(), cos, sin, positions)
    Q, K = Q0.clone(), K0.clone()
    kernels.rope(Q, K, cos, sin, positions)  # compiled before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernels.rope(Q, K, cos, sin, positions)
    Q.copy_(Q0), K.copy_(K0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(Q, expected[0]) and torch.equal(K, expected[1])
