"""GeGLU (Gemma's MLP) and its raw LoRA-MLP kernels: HF's maths, five declared ops (the autograd op
with the tanh and the exact GeLU as variants; the raw forward and backward of each) and the
benchmark; their hand-written noise model is geglu_noise.py.

Everything the harness knows about these ops is here (docs/design.md §6).
"""

from __future__ import annotations

import functools
import math
import torch
import torch.nn.functional as F

from oracle import ErrorInput, Op, PerVariant
from oracle.bench.workload import Bench, Peers, Workload, checkout_kernels, compiled, instantiate, randn_cuda
from oracle.declare.reference import mirrors
from oracle.ops.elementwise import (SCALE, SHAPE, VALUE_KINDS, elementwise_errors, float64_cases, lora_backward,
                                    raw_backward_into_buffers, raw_forward, sweep, tensors)
from oracle.ops.geglu_noise import BETA, KAPPA, noise_model, raw_backward_noise

APPROXIMATIONS = ("tanh", "none")  # GemmaMLP's gelu_pytorch_tanh, and the exact (erf) GeLU


# --- HF's maths -----------------------------------------------------------------------------------


@mirrors("transformers.models.gemma.modeling_gemma.GemmaMLP.forward's act_fn(gate) * up, act_fn = GELUTanh "
         "(gelu_pytorch_tanh) or GELUActivation (gelu)")
def geglu(e: torch.Tensor, g: torch.Tensor, approximate: str = "tanh", compute=None) -> torch.Tensor:
    return F.gelu(e, approximate=approximate) * g


def geglu_reordered(e, g, approximate: str = "tanh", compute=torch.float32):
    """GeLU from its formula in the compute dtype (``e`` upcast once), rounded once, then times g."""
    x = e.to(compute)
    if approximate == "tanh":
        f = 0.5 * x * (1 + torch.tanh(BETA * (x + KAPPA * x * x * x)))
    else:
        f = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    return f.to(e.dtype) * g


def geglu_lora_backward(DW, e, g, approximate: str = "tanh", compute=None):
    """What the raw backward kernels must produce: (h, df, de) by HF's autograd of h = gelu(e) * g."""
    return lora_backward(functools.partial(geglu, approximate=approximate), DW, e, g, compute)


def geglu_lora_backward_reordered(DW, e, g, approximate: str = "tanh", compute=torch.float32):
    return lora_backward(functools.partial(geglu_reordered, approximate=approximate), DW, e, g, compute)


# --- bad inputs -----------------------------------------------------------------------------------


def _geglu_errors() -> list[ErrorInput]:
    def args(d, **given):
        gen = torch.Generator().manual_seed(0)
        return {"e": torch.randn(3, 4, generator=gen).to(d), "g": torch.randn(3, 4, generator=gen).to(d)} | given

    return elementwise_errors(("e", "g"), raw=False)() + [
        ErrorInput("approximate not a str", lambda d: args(d, approximate=True), TypeError, "approximate must be a str"),
        ErrorInput("approximate unknown", lambda d: args(d, approximate="sigmoid"), ValueError, "'tanh' or 'none'"),
        ErrorInput.same_as_hf("approximate 'none'", lambda d: args(d, approximate="none")),
    ]


# --- the benchmark (GPU): Gemma-2-9B's MLP, 16384 tokens x 14336 ----------------------------------


def _bench_peers(include_liger: bool) -> Peers:
    kernels = checkout_kernels()

    # Liger's GeGLU (tanh only) is not wired in: its adapter (peers/liger/builtin.py) has no counterpart.
    return {"kernels": lambda: kernels.geglu, "eager": lambda: geglu, "compile": lambda: compiled(geglu)}


def geglu_workload(peers: Peers, dtype, rows=16384, cols=14336) -> Workload:
    e = randn_cuda(rows, cols, dtype=dtype, requires_grad=True)
    g = randn_cuda(rows, cols, dtype=dtype, requires_grad=True)
    dh = randn_cuda(rows, cols, dtype=dtype)
    e_bytes = e.numel() * e.element_size()
    work = Workload("geglu", "tanh", dtype, fwd_bytes=3 * e_bytes, fwd_bwd_bytes=8 * e_bytes)
    for name, fn in instantiate(peers).items():
        work.forward[name] = lambda fn=fn: fn(e, g, "tanh")

        def fwd_bwd(fn=fn):
            h = fn(e, g, "tanh")
            return torch.autograd.grad(h, (e, g), dh)

        work.forward_backward[name] = fwd_bwd
    return work


BENCH = Bench(peers=_bench_peers, workloads=lambda peers, dtype: [geglu_workload(peers, dtype)])


# --- the declarations -----------------------------------------------------------------------------


GEGLU = Op(
    "geglu", reference=geglu, reordered=geglu_reordered, variants=APPROXIMATIONS, outputs=("h",),
    summary="gelu(e) * g as GemmaMLP computes it (tanh or exact); h, de, dg",
    inputs=tensors("e", "g", autograd=True), dims=SHAPE, value_kinds=VALUE_KINDS,
    # the variant is the approximation, passed as it is
    params={"approximate": PerVariant(**{approximate: approximate for approximate in APPROXIMATIONS})},
    sweep=sweep(False, autograd=True), full_sweep=sweep(True, autograd=True), scale=SCALE,
    float64_cases=float64_cases(autograd=True, variants=APPROXIMATIONS), error_inputs=_geglu_errors,
    noise=noise_model(None),
)


def _raw_ops(approximate: str, kind: str) -> tuple[Op, Op]:
    """The raw forward and backward kernels of one approximation (``kind``: approx or exact)."""
    forward = functools.partial(geglu, approximate=approximate)
    backward = functools.partial(geglu_lora_backward, approximate=approximate)
    bwd_name = f"geglu_{kind}_backward_kernel"
    fwd = Op(
        f"geglu_{kind}_forward_kernel", reference=forward, outputs=("h",), differentiable=(),
        reordered=functools.partial(geglu_reordered, approximate=approximate), hf=raw_forward(forward),
        summary=f"raw GeGLU forward ({approximate}): a new h = gelu(e) * g",
        inputs=tensors("e", "g", autograd=False), dims=SHAPE, value_kinds=VALUE_KINDS,
        sweep=sweep(False, autograd=False), full_sweep=sweep(True, autograd=False), scale=SCALE,
        float64_cases=float64_cases(autograd=False), error_inputs=elementwise_errors(("e", "g"), raw=True),
        noise={"h": noise_model(approximate)["h"]},
    )
    bwd = Op(
        bwd_name, reference=backward, outputs=("h", "df", "de"), differentiable=(),
        reordered=functools.partial(geglu_lora_backward_reordered, approximate=approximate),
        hf=raw_backward_into_buffers(backward, bwd_name),
        summary=f"raw GeGLU LoRA-MLP backward ({approximate}): h, df, de written into DW, e, g",
        inputs=tensors("DW", "e", "g", autograd=False), dims=SHAPE, value_kinds=VALUE_KINDS,
        may_clobber=("DW", "e", "g"), writes_into={"h": "DW", "df": "e", "de": "g"},
        sweep=sweep(False, autograd=False), full_sweep=sweep(True, autograd=False), scale=SCALE,
        float64_cases=float64_cases(autograd=False), error_inputs=elementwise_errors(("DW", "e", "g"), raw=True),
        noise=raw_backward_noise(approximate),
    )
    return fwd, bwd


SPECS = (GEGLU, *_raw_ops("tanh", "approx"), *_raw_ops("none", "exact"))
