"""SwiGLU and its raw LoRA-MLP kernels: HF's maths, three declared ops (the autograd op, the raw
forward, the raw backward) and the benchmark; their hand-written noise model is swiglu_noise.py.
What they share with other gated MLPs is in oracle/ops/elementwise.py.

Everything the harness knows about these ops is here (docs/design.md §6).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from oracle import Op
from oracle.bench.workload import (Bench, Peers, Workload, checkout_kernels, compiled, instantiate, randn_cuda,
                                   vendor_peers)
from oracle.declare.reference import mirrors
from oracle.ops.elementwise import (SCALE, SHAPE, VALUE_KINDS, elementwise_errors, float64_cases, lora_backward,
                                    raw_backward_into_buffers, raw_forward, sweep, tensors)
from oracle.ops.swiglu_noise import RAW_BACKWARD_NOISE, SWIGLU_NOISE


# --- HF's maths -----------------------------------------------------------------------------------


@mirrors("transformers.models.llama.modeling_llama.LlamaMLP.forward's act_fn(gate) * up, act_fn = nn.SiLU")
def swiglu(e: torch.Tensor, g: torch.Tensor, compute=None) -> torch.Tensor:
    return F.silu(e) * g


def swiglu_reordered(e, g, compute=torch.float32):
    """silu as e * sigmoid(e) in the compute dtype, rounded once, then times g. ``e`` is upcast once,
    so autograd sums the two paths of de in the compute dtype and rounds once, as silu's own
    backward does (upcasting it twice would round each path to e's dtype before summing)."""
    wide = e.to(compute)
    return (wide * torch.sigmoid(wide)).to(e.dtype) * g


@mirrors("transformers.models.llama.modeling_llama.LlamaMLP.forward")
def llama_mlp(x, gate_weight, up_weight, down_weight, compute=None):
    return F.linear(swiglu(F.linear(x, gate_weight), F.linear(x, up_weight)), down_weight)


def swiglu_lora_backward(DW, e, g, compute=None):
    """What the raw kernel swiglu_DWf_DW_dfg_kernel must produce: (h, df, de) by HF's autograd of
    h = silu(e) * g, for the incoming gradient DW (df: g's gradient, de: e's)."""
    return lora_backward(swiglu, DW, e, g, compute)


def swiglu_lora_backward_reordered(DW, e, g, compute=torch.float32):
    return lora_backward(swiglu_reordered, DW, e, g, compute)


# --- Liger-Kernel, and the benchmark (GPU) --------------------------------------------------------


def _bench_peers(include_liger: bool) -> Peers:
    kernels = checkout_kernels()

    peers = {"kernels": lambda: kernels.swiglu, "eager": lambda: swiglu, "compile": lambda: compiled(swiglu)}
    return peers | vendor_peers("swiglu", include_liger)


def swiglu_workload(peers: Peers, dtype, rows=16384, cols=14336) -> Workload:
    e = randn_cuda(rows, cols, dtype=dtype, requires_grad=True)
    g = randn_cuda(rows, cols, dtype=dtype, requires_grad=True)
    dh = randn_cuda(rows, cols, dtype=dtype)
    e_bytes = e.numel() * e.element_size()
    work = Workload("swiglu", "default", dtype, fwd_bytes=3 * e_bytes, fwd_bwd_bytes=8 * e_bytes)
    for name, fn in instantiate(peers).items():
        work.forward[name] = lambda fn=fn: fn(e, g)

        def fwd_bwd(fn=fn):
            h = fn(e, g)
            return torch.autograd.grad(h, (e, g), dh)

        work.forward_backward[name] = fwd_bwd
    return work


BENCH = Bench(peers=_bench_peers, workloads=lambda peers, dtype: [swiglu_workload(peers, dtype)])


# --- the declarations -----------------------------------------------------------------------------


SWIGLU = Op(
    "swiglu", reference=swiglu, reordered=swiglu_reordered, outputs=("h",),
    summary="silu(e) * g as LlamaMLP computes it; h, de, dg",
    inputs=tensors("e", "g", autograd=True), dims=SHAPE, value_kinds=VALUE_KINDS,
    sweep=sweep(False, autograd=True), full_sweep=sweep(True, autograd=True), scale=SCALE,
    float64_cases=float64_cases(autograd=True), error_inputs=elementwise_errors(("e", "g"), raw=False),
    noise=SWIGLU_NOISE,
)

SWIGLU_FG = Op(
    "swiglu_fg_kernel", reference=swiglu, reordered=swiglu_reordered, outputs=("h",), differentiable=(),
    summary="raw SwiGLU forward: a new h = silu(e) * g", hf=raw_forward(swiglu),
    inputs=tensors("e", "g", autograd=False), dims=SHAPE, value_kinds=VALUE_KINDS,
    sweep=sweep(False, autograd=False), full_sweep=sweep(True, autograd=False), scale=SCALE,
    float64_cases=float64_cases(autograd=False), error_inputs=elementwise_errors(("e", "g"), raw=True),
    noise={"h": SWIGLU_NOISE["h"]},
)

SWIGLU_BACKWARD = Op(
    "swiglu_DWf_DW_dfg_kernel", reference=swiglu_lora_backward, reordered=swiglu_lora_backward_reordered,
    outputs=("h", "df", "de"), differentiable=(), summary="raw LoRA-MLP backward: h, df, de written into DW, e, g",
    hf=raw_backward_into_buffers(swiglu_lora_backward, "swiglu_DWf_DW_dfg_kernel"),
    inputs=tensors("DW", "e", "g", autograd=False), dims=SHAPE, value_kinds=VALUE_KINDS,
    may_clobber=("DW", "e", "g"), writes_into={"h": "DW", "df": "e", "de": "g"},
    sweep=sweep(False, autograd=False), full_sweep=sweep(True, autograd=False), scale=SCALE,
    float64_cases=float64_cases(autograd=False), error_inputs=elementwise_errors(("DW", "e", "g"), raw=True),
    noise=RAW_BACKWARD_NOISE,
)

SPECS = (SWIGLU, SWIGLU_FG, SWIGLU_BACKWARD)
