"""SwiGLU and its raw LoRA-MLP kernels: HF's maths, the noise model, three specs (the autograd op,
the raw forward, the raw backward) and the benchmark. The element-wise plumbing they share with
other gated MLPs is in oracle/ops/elementwise.py.

Everything the harness knows about these ops is here (docs/design.md §6).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from oracle import cases as C
from oracle.cases import (Case)
from oracle.declare.reference import mirrors
from oracle.declare.spec import (OpSpec, compute_dtype, layout_last_two,
                     rounding_error, unit_roundoff, wide)
from oracle.bench.workload import Bench, checkout_kernels, Peers, Workload, compiled, instantiate, randn_cuda, vendor_peers
from oracle.ops.elementwise import (elementwise_args, elementwise_cases, elementwise_errors, elementwise_stratified,
                          elementwise_scale, elementwise_sweep, lora_backward, raw_backward_into_buffers, raw_forward,
                          PROGRAMS)


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


# --- arguments, noise model, report grid, bad inputs ----------------------------------------------


class _SwigluParts:
    """SwiGLU's float64 intermediates and unit roundoffs, shared by its noise models.

    Error analysis of HF's evaluation (F.silu(e) * g and its autograd): silu is evaluated in the
    compute dtype (exp, a division: a few u_c) and rounded to the model dtype d (u_d); the product
    with g is the final rounding. Autograd forms dh * g in d (u_d), then silu's derivative
    s (1 + e (1 - s)) in the compute dtype (a few u_c more) and rounds the product.
    """

    def __init__(self, args: dict, upstream: dict, incoming: str):
        e = wide(args["e"])
        self.g = wide(args["g"])
        self.dtype = args["e"].dtype
        compute = compute_dtype(self.dtype)
        self.u_c = unit_roundoff(compute)
        # exp(-e) overflows the compute dtype below e ~ -88 (fp32): sigmoid flushes to 0, losing up to
        # the compute dtype's smallest normal number, times |e| in silu and its slope.
        self.flushed = torch.finfo(compute).smallest_normal * (1 + e.abs())
        self.sig = torch.sigmoid(e)
        self.f = e * self.sig
        self.silu_slope = self.sig * (1 + e.abs() * (1 - self.sig))  # |terms| of silu'(e)
        # 1 - s is formed from the rounded s: an absolute error of u_c, times |e| s in the slope
        self.slope_noise = self.u_c * (8 * self.silu_slope + 2 * e.abs() * self.sig)
        # the incoming gradient: upstream's for the autograd op, the DW argument for the raw backward
        incoming = upstream.get(incoming, args.get(incoming))
        self.dh = wide(incoming) if incoming is not None else None


def _swiglu_noise(tensor: str, incoming: str = "h") -> Callable[[dict, dict], torch.Tensor]:
    """h = f g and the gradient of g, dh f: f rounded to d after a few u_c. The gradient of e,
    dh g silu'(e): dh g rounded to d, the slope's terms in the compute dtype."""
    def noise(args: dict, upstream: dict) -> torch.Tensor:
        p = _SwigluParts(args, upstream, incoming)
        if tensor in ("h", "dg"):
            other = p.g if tensor == "h" else p.dh
            f_err = rounding_error(p.f.abs(), p.dtype) + 4 * p.u_c * p.f.abs() + p.flushed
            return other.abs() * f_err
        dh_g = (p.dh * p.g).abs()
        return rounding_error(dh_g, p.dtype) * p.silu_slope + (p.slope_noise + p.flushed) * dh_g

    return noise


_SWIGLU_NOISE = {"h": _swiglu_noise("h"), "de": _swiglu_noise("de"), "dg": _swiglu_noise("dg")}
# The raw backward's df is the gradient of g and de of e, for the incoming gradient DW.
_RAW_BACKWARD_NOISE = {"h": _swiglu_noise("h", "DW"), "df": _swiglu_noise("dg", "DW"), "de": _swiglu_noise("de", "DW")}


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


# --- the specs ------------------------------------------------------------------------------------


SWIGLU = OpSpec(
    name="swiglu", variants=("default",), summary="silu(e) * g as LlamaMLP computes it; h, de, dg",
    arg_names=("e", "g"), call=lambda fn, a: (fn(a["e"], a["g"]),), outputs=("h",), differentiable=("e", "g"),
    reference=swiglu, reference_reordered=swiglu_reordered,
    cases=lambda budget, dtypes=C.FLOAT_DTYPES: elementwise_cases(budget, "swiglu", True, dtypes),
    stratified=elementwise_stratified("swiglu", autograd=True),
    make_args=elementwise_args(("e", "g")), layout_args=("e", "g"), layout_of=layout_last_two,
    sweep=elementwise_sweep("swiglu", autograd=True), scale=elementwise_scale("swiglu"), programs=PROGRAMS,
    float64_cases=(Case("swiglu", "default", "float64", {"shape": [3, 7]}, "transposed", "normal", {}, seed=1),),
    error_inputs=elementwise_errors(("e", "g"), raw=False), noise=_SWIGLU_NOISE,
)

SWIGLU_FG = OpSpec(
    name="swiglu_fg_kernel", variants=("default",), summary="raw SwiGLU forward: a new h = silu(e) * g",
    arg_names=("e", "g"), call=lambda fn, a: (fn(a["e"], a["g"]),), outputs=("h",), differentiable=(),
    reference=swiglu, reference_reordered=swiglu_reordered,
    cases=lambda budget, dtypes=C.FLOAT_DTYPES: elementwise_cases(budget, "swiglu_fg_kernel", False, dtypes),
    stratified=elementwise_stratified("swiglu_fg_kernel", autograd=False),
    make_args=elementwise_args(("e", "g")), layout_args=(), layout_of=layout_last_two,
    sweep=elementwise_sweep("swiglu_fg_kernel", autograd=False), scale=elementwise_scale("swiglu_fg_kernel"),
    programs=PROGRAMS,
    float64_cases=(Case("swiglu_fg_kernel", "default", "float64", {"shape": [3, 7]}, "contiguous", "outliers", {},
                        seed=1),),
    error_inputs=elementwise_errors(("e", "g"), raw=True),
    noise={"h": _SWIGLU_NOISE["h"]}, hf=raw_forward(swiglu),
)

SWIGLU_BACKWARD = OpSpec(
    name="swiglu_DWf_DW_dfg_kernel", variants=("default",),
    summary="raw LoRA-MLP backward: h, df, de written into DW, e, g",
    arg_names=("DW", "e", "g"), call=lambda fn, a: tuple(fn(a["DW"], a["e"], a["g"])), outputs=("h", "df", "de"),
    differentiable=(), reference=swiglu_lora_backward, reference_reordered=swiglu_lora_backward_reordered,
    cases=lambda budget, dtypes=C.FLOAT_DTYPES: elementwise_cases(budget, "swiglu_DWf_DW_dfg_kernel", False, dtypes),
    stratified=elementwise_stratified("swiglu_DWf_DW_dfg_kernel", autograd=False),
    make_args=elementwise_args(("DW", "e", "g")), layout_args=(), layout_of=layout_last_two,
    sweep=elementwise_sweep("swiglu_DWf_DW_dfg_kernel", autograd=False),
    scale=elementwise_scale("swiglu_DWf_DW_dfg_kernel"), programs=PROGRAMS,
    buffers_hold_outputs={"h": "DW", "df": "e", "de": "g"}, may_clobber=("DW", "e", "g"),
    float64_cases=(Case("swiglu_DWf_DW_dfg_kernel", "default", "float64", {"shape": [3, 7]}, "contiguous", "outliers",
                        {}, seed=1),),
    error_inputs=elementwise_errors(("DW", "e", "g"), raw=True), noise=_RAW_BACKWARD_NOISE,
    hf=raw_backward_into_buffers(swiglu_lora_backward, "swiglu_DWf_DW_dfg_kernel"),
)

SPECS = (SWIGLU, SWIGLU_FG, SWIGLU_BACKWARD)
