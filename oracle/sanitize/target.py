"""The program compute-sanitizer runs: ``python -m oracle.sanitize.target --impl NAME --op OP``.

Every case of the op's quick grid (the report's, float64 left out) once: forward, and backward for a
differentiable op. Each tensor handed to the implementation sits in storage of exactly the span its
layout needs (the offset before it, the gaps between its rows, nothing after its last element), in
an allocation of its own (the parent sets PYTORCH_NO_CUDA_MEMORY_CACHING=1), so an access one element
past it lies outside every allocation and memcheck reports it. The engine is not used: its guard
bands would absorb an overrun, and its HF references would put torch's own kernels under the
sanitizer too.

Prints ``case: LABEL`` before each case, so that a record can be traced to the case that made it,
``autotuned: KERNEL: CONFIG; ...`` after a case that launched autotuned kernels, and ``cases: N``
once every case ran. An autotuned kernel runs one config per case, the one the engine's verdict and
the repro of that case run (oracle/cases/autotune.py, Note [One config per case]): so the cases cover every
config, and nothing is benchmarked under the sanitizer, where every config of every new width would
be timed many times over.
"""

from __future__ import annotations

import argparse
import sys

import torch

from oracle.cases import autotune
from oracle.cases import Case
from oracle.engine import gradient_layout
from oracle.declare.implementations import load
from oracle.checks.memory import CONTIGUOUS, Layout, copy_into
from oracle.declare.registry import SPECS
from oracle.declare.registry import load_declared
from oracle.declare.spec import OpSpec, upstream_gradient
from oracle.sanitize.findings import AUTOTUNED_MARK


def exact_storage(shape, dtype: torch.dtype, device, layout: Layout) -> torch.Tensor:
    """An uninitialised tensor of ``shape`` in ``layout`` whose storage holds exactly the elements the
    layout spans. The gaps stay unwritten, so initcheck also sees a kernel that reads them."""
    shape = tuple(shape)
    strides = layout.strides(shape)
    span = 1 + sum((size - 1) * stride for size, stride in zip(shape, strides)) if all(shape) else 0
    flat = torch.empty(layout.offset + span, dtype=dtype, device=device)
    return flat.as_strided(shape, strides, layout.offset)


def place_arguments(spec: OpSpec, case: Case, args: dict, device) -> tuple[dict, dict]:
    """The call's arguments in exact storage (the layout arguments in the case's layout, other
    tensors contiguous), and the leaves their differentiable ones are copied from: gradients arrive
    there, through the copy."""
    placed, leaves = {}, {}
    for name, value in args.items():
        if not isinstance(value, torch.Tensor):
            placed[name] = value
            continue
        layout = spec.layout_of(case.layout, tuple(value.shape)) if name in spec.layout_args else CONTIGUOUS
        home = exact_storage(value.shape, value.dtype, device, layout)
        if name in spec.differentiable:
            leaves[name] = value.detach().clone().requires_grad_()
            with torch.enable_grad():
                placed[name] = home.copy_(leaves[name])
        else:
            with torch.no_grad():
                placed[name] = home.copy_(value)
    return placed, leaves


def place_gradients(spec: OpSpec, case: Case, outputs: dict[str, torch.Tensor], device) -> dict[str, torch.Tensor]:
    """The gradients fed to backward, in the case's gradient layout and exact storage (a
    row-broadcast gradient: one row's storage under a stride-0 view)."""
    gradients = {}
    for name, out in outputs.items():
        home = exact_storage(out.shape, out.dtype, device, gradient_layout(spec, case, tuple(out.shape)))
        with torch.no_grad():
            gradients[name] = copy_into(home, upstream_gradient(case, name, out))
    return gradients


def run_case(spec: OpSpec, fn, case: Case, device) -> dict[str, torch.Tensor]:
    """One case through the implementation; returns the leaves (with their gradients, when the op
    is differentiable)."""
    args, leaves = place_arguments(spec, case, spec.make_args(case, device), device)
    with torch.enable_grad():
        outs = spec.call(fn, args)
    if len(outs) != len(spec.outputs):
        raise TypeError(f"{spec.name} returned {len(outs)} value(s), the contract has {len(spec.outputs)}")
    if spec.differentiable:
        outputs = dict(zip(spec.outputs, outs))
        for name, out in outputs.items():
            if not out.requires_grad:
                raise TypeError(f"{spec.name}'s output {name} does not require grad; autograd cannot reach the inputs")
        gradients = place_gradients(spec, case, outputs, device)
        torch.autograd.backward(list(outputs.values()), [gradients[name] for name in outputs])
    return leaves


def cases_of(spec: OpSpec) -> list[Case]:
    """The report's quick grid, without float64 (there for gradcheck; not every implementation takes it)."""
    return [case for case in spec.sweep(False) if case.dtype != "float64"]


def main(argv=None) -> int:
    load_declared()  # ORACLE_OP_MODULES: the ops python -m oracle.sanitize --op-module declared
    parser = argparse.ArgumentParser(prog="python -m oracle.sanitize.target", description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", required=True)
    parser.add_argument("--op", required=True, choices=sorted(SPECS))
    parser.add_argument("--device", default="cuda", help="cuda (default); cpu only to test this program with --impl hf")
    args = parser.parse_args(argv)
    fn = load(args.impl).op(args.op)
    if fn is None:
        print(f"error: {args.impl} has no {args.op}", file=sys.stderr)
        return 2
    spec, device = SPECS[args.op], torch.device(args.device)
    cases = cases_of(spec)
    autotune.install()
    for case in cases:
        print(f"case: {case.label}", flush=True)
        with autotune.pinned(autotune.case_number(case)):
            run_case(spec, fn, case, device)
            configs = autotune.chosen()
        if device.type == "cuda":
            torch.cuda.synchronize()  # the case's kernels finish, and are reported, before the next case mark
        if configs:
            print(f"{AUTOTUNED_MARK}{'; '.join(configs)}", flush=True)
    print(f"cases: {len(cases)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
