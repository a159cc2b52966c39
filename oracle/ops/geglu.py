"""GeGLU (Gemma's MLP) and its raw LoRA-MLP kernels: HF's maths, the noise model, five specs (the
autograd op with the tanh and the exact GeLU as variants; the raw forward and backward of each) and
the benchmark.

Everything the harness knows about these ops is here (docs/design.md §6).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from oracle import cases as C
from oracle.cases import Case
from oracle.declare.reference import mirrors
from oracle.declare.spec import ErrorInput, OpSpec, compute_dtype, layout_last_two, rounding_error, unit_roundoff, wide
from oracle.bench.workload import Bench, checkout_kernels, Peers, Workload, compiled, instantiate, randn_cuda, vendor_peers
from oracle.ops.elementwise import (elementwise_args, elementwise_cases, elementwise_errors, elementwise_stratified,
                          elementwise_scale, elementwise_sweep, lora_backward, raw_backward_into_buffers, raw_forward,
                          PROGRAMS)

APPROXIMATIONS = ("tanh", "none")  # GemmaMLP's gelu_pytorch_tanh, and the exact (erf) GeLU
_BETA = math.sqrt(2 / math.pi)
_KAPPA = 0.044715


# --- HF's maths -----------------------------------------------------------------------------------


@mirrors("transformers.models.gemma.modeling_gemma.GemmaMLP.forward's act_fn(gate) * up, act_fn = GELUTanh "
         "(gelu_pytorch_tanh) or GELUActivation (gelu)")
def geglu(e: torch.Tensor, g: torch.Tensor, approximate: str = "tanh", compute=None) -> torch.Tensor:
    return F.gelu(e, approximate=approximate) * g


def geglu_reordered(e, g, approximate: str = "tanh", compute=torch.float32):
    """GeLU from its formula in the compute dtype (``e`` upcast once), rounded once, then times g."""
    x = e.to(compute)
    if approximate == "tanh":
        f = 0.5 * x * (1 + torch.tanh(_BETA * (x + _KAPPA * x * x * x)))
    else:
        f = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    return f.to(e.dtype) * g


def geglu_lora_backward(DW, e, g, approximate: str = "tanh", compute=None):
    """What the raw backward kernels must produce: (h, df, de) by HF's autograd of h = gelu(e) * g."""
    return lora_backward(functools.partial(geglu, approximate=approximate), DW, e, g, compute)


def geglu_lora_backward_reordered(DW, e, g, approximate: str = "tanh", compute=torch.float32):
    return lora_backward(functools.partial(geglu_reordered, approximate=approximate), DW, e, g, compute)


# --- noise model ----------------------------------------------------------------------------------


class _GegluParts:
    """GeGLU's float64 intermediates, shared by its noise models.

    Error analysis of HF's evaluation (torch's gelu and its backward, in the compute dtype):
    f = 0.5 e (1 + s), s = tanh(u) or erf(e / sqrt 2): 1 + s cancels where e is very negative, so f's
    error is a few u_c at the scale of its terms, 0.5 |e| (1 + |s|), not of f; then f is rounded to
    the model dtype d and multiplied by g. The slope f'(e) = 0.5 (1 + s) + e s'(e) / 2 is a sum of
    terms formed in the compute dtype (1 - s^2 cancels for the tanh form), and autograd rounds
    dh * g to d before multiplying by it.
    """

    def __init__(self, args: dict, upstream: dict, incoming: str, approximate: str):
        e = wide(args["e"])
        self.g = wide(args["g"])
        self.dtype = args["e"].dtype
        self.u_c = unit_roundoff(compute_dtype(self.dtype))
        if approximate == "tanh":
            inner = _BETA * (e + _KAPPA * e ** 3)
            s = torch.tanh(inner)
            # |terms| of the slope: 0.5 (1 + s), and 0.5 e (1 - s^2) beta (1 + 3 kappa e^2), whose 1 - s^2
            # is formed from a rounded s
            chain = 0.5 * e.abs() * _BETA * (1 + 3 * _KAPPA * e * e)
            self.slope_terms = 0.5 * (1 + s.abs()) + chain * ((1 - s * s).abs() + 2 * self.u_c)
        else:
            s = torch.erf(e / math.sqrt(2))
            pdf = torch.exp(-0.5 * e * e) / math.sqrt(2 * math.pi)
            self.slope_terms = 0.5 * (1 + s.abs()) + e.abs() * pdf
        self.f = 0.5 * e * (1 + s)
        self.f_terms = 0.5 * e.abs() * (1 + s.abs())
        incoming = upstream.get(incoming, args.get(incoming))
        self.dh = wide(incoming) if incoming is not None else None


def _geglu_noise(tensor: str, approximate: str | None, incoming: str = "h") -> Callable[[dict, dict], torch.Tensor]:
    """h = f g and g's gradient dh f: f formed to a few u_c of its terms, then rounded to d. e's
    gradient (dh g rounded to d) f'(e): the slope's terms to a few u_c. ``approximate`` None: the
    case's own (the autograd op's variant, passed as an argument)."""
    def noise(args: dict, upstream: dict) -> torch.Tensor:
        p = _GegluParts(args, upstream, incoming, approximate or args.get("approximate", "tanh"))
        if tensor in ("h", "dg"):
            other = p.g if tensor == "h" else p.dh
            return other.abs() * (rounding_error(p.f.abs(), p.dtype) + 6 * p.u_c * p.f_terms)
        dh_g = (p.dh * p.g).abs()
        return rounding_error(dh_g, p.dtype) * p.slope_terms + 8 * p.u_c * p.slope_terms * dh_g

    return noise


def _noise(approximate: str | None) -> dict:
    return {"h": _geglu_noise("h", approximate), "de": _geglu_noise("de", approximate),
            "dg": _geglu_noise("dg", approximate)}


def _raw_backward_noise(approximate: str) -> dict:
    # the raw backward's df is g's gradient and de is e's, for the incoming gradient DW
    return {"h": _geglu_noise("h", approximate, "DW"), "df": _geglu_noise("dg", approximate, "DW"),
            "de": _geglu_noise("de", approximate, "DW")}


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


# --- the specs ------------------------------------------------------------------------------------


def _approximation(case: Case) -> dict:
    return {"approximate": case.variant}


GEGLU = OpSpec(
    name="geglu", variants=APPROXIMATIONS, summary="gelu(e) * g as GemmaMLP computes it (tanh or exact); h, de, dg",
    arg_names=("e", "g", "approximate"), call=lambda fn, a: (fn(a["e"], a["g"], a.get("approximate", "tanh")),),
    outputs=("h",), differentiable=("e", "g"), reference=geglu, reference_reordered=geglu_reordered,
    cases=lambda budget, dtypes=C.FLOAT_DTYPES: elementwise_cases(budget, "geglu", True, dtypes, APPROXIMATIONS),
    stratified=elementwise_stratified("geglu", autograd=True, variants=APPROXIMATIONS),
    make_args=elementwise_args(("e", "g"), _approximation), layout_args=("e", "g"), layout_of=layout_last_two,
    sweep=elementwise_sweep("geglu", autograd=True, variants=APPROXIMATIONS),
    scale=elementwise_scale("geglu", APPROXIMATIONS), programs=PROGRAMS,
    float64_cases=tuple(Case("geglu", approximate, "float64", {"shape": [3, 7]}, "transposed", "normal", {}, seed=1)
                        for approximate in APPROXIMATIONS),
    error_inputs=_geglu_errors, noise=_noise(None),
)


def _raw_specs(approximate: str, kind: str) -> tuple[OpSpec, OpSpec]:
    """The raw forward and backward kernels of one approximation (``kind``: approx or exact)."""
    forward = functools.partial(geglu, approximate=approximate)
    forward_reordered = functools.partial(geglu_reordered, approximate=approximate)
    backward = functools.partial(geglu_lora_backward, approximate=approximate)
    backward_reordered = functools.partial(geglu_lora_backward_reordered, approximate=approximate)
    fwd_name, bwd_name = f"geglu_{kind}_forward_kernel", f"geglu_{kind}_backward_kernel"
    noise = _noise(approximate)
    fwd = OpSpec(
        name=fwd_name, variants=("default",), summary=f"raw GeGLU forward ({approximate}): a new h = gelu(e) * g",
        arg_names=("e", "g"), call=lambda fn, a: (fn(a["e"], a["g"]),), outputs=("h",), differentiable=(),
        reference=forward, reference_reordered=forward_reordered,
        cases=lambda budget, dtypes=C.FLOAT_DTYPES: elementwise_cases(budget, fwd_name, False, dtypes),
        stratified=elementwise_stratified(fwd_name, autograd=False),
        make_args=elementwise_args(("e", "g")), layout_args=(), layout_of=layout_last_two,
        sweep=elementwise_sweep(fwd_name, autograd=False), scale=elementwise_scale(fwd_name), programs=PROGRAMS,
        float64_cases=(Case(fwd_name, "default", "float64", {"shape": [3, 7]}, "contiguous", "outliers", {}, seed=1),),
        error_inputs=elementwise_errors(("e", "g"), raw=True), noise={"h": noise["h"]}, hf=raw_forward(forward),
    )
    bwd = OpSpec(
        name=bwd_name, variants=("default",),
        summary=f"raw GeGLU LoRA-MLP backward ({approximate}): h, df, de written into DW, e, g",
        arg_names=("DW", "e", "g"), call=lambda fn, a: tuple(fn(a["DW"], a["e"], a["g"])), outputs=("h", "df", "de"),
        differentiable=(), reference=backward, reference_reordered=backward_reordered,
        cases=lambda budget, dtypes=C.FLOAT_DTYPES: elementwise_cases(budget, bwd_name, False, dtypes),
        stratified=elementwise_stratified(bwd_name, autograd=False),
        make_args=elementwise_args(("DW", "e", "g")), layout_args=(), layout_of=layout_last_two,
        sweep=elementwise_sweep(bwd_name, autograd=False), scale=elementwise_scale(bwd_name), programs=PROGRAMS,
        buffers_hold_outputs={"h": "DW", "df": "e", "de": "g"}, may_clobber=("DW", "e", "g"),
        float64_cases=(Case(bwd_name, "default", "float64", {"shape": [3, 7]}, "contiguous", "outliers", {}, seed=1),),
        error_inputs=elementwise_errors(("DW", "e", "g"), raw=True), noise=_raw_backward_noise(approximate),
        hf=raw_backward_into_buffers(backward, bwd_name),
    )
    return fwd, bwd


SPECS = (GEGLU, *_raw_specs("tanh", "approx"), *_raw_specs("none", "exact"))
