"""How far an implementation's float32 values lie from torch's where it promises HF's rounding steps
(oracle/checks/rounding.py, Note [HF's rounding steps, given float32 values within K ULPs]): the
measurement ROUNDING_ULPS is chosen from. Run it where the contract is to hold (the CPU's
interpreter, and the GPU, whose exp, rsqrt and reductions differ from the CPU's).

    python scripts/rounding_distance.py [--impl kernels] [--seeds 10] [--ops rms_norm,...] [--device cuda]

For every op and tensor the implementation declares "rounding", over the stratified 16-bit cases of
the CPU budget, each repeated with ``--seeds`` seeds:

- ``smallest K``: the smallest number of float32 ULPs (of 0, 1, 2, 4, ..., 64) by which HF's roundings
  must move for every case to keep the contract; ``>64`` where none does;
- ``float32 distance``: the implementation run on the same inputs upcast to float32, against HF's
  maths there: the largest distance in ULPs of the value, and its 99.99th percentile. That is the
  float32 value before the rounding for a norm (Gemma's; Llama's times W adds one rounding), and
  the activation times g (one rounding more). Where the value is a small difference of large terms
  (GeLU of a negative x) it is thousands of ULPs of the value and a few of the terms, which is why
  the contract moves such a function by the size of its terms.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from oracle import engine
from oracle.cases import CPU_BUDGET
from oracle.checks import exact as exact_check
from oracle.checks import rounding
from oracle.declare.implementations import load
from oracle.declare.registry import SPECS
from oracle.verdict import ulp_distance

STEPS = (0, 1, 2, 4, 8, 16, 32, 64)


def kept_with(steps: int, spec, prepared, got: dict, names: list[str]) -> bool:
    """Whether every tensor of ``names`` keeps the contract with HF's roundings moved by ``steps``."""
    rounding.ROUNDING_ULPS = steps
    prepared.nudged.clear()
    for name in names:
        down, up = prepared.nudged_evaluations(spec, [name])[name]
        k, h = prepared.compared_part(name, got[name]), prepared.hf.tensors()[name]
        if exact_check.outside_rounding(k, h, down, up, prepared.truth.tensors()[name]) is not None:
            return False
    return True


def float32_distances(spec, impl, case, names: list[str], device) -> torch.Tensor:
    """ULP distances of the implementation's float32 values from HF's, on the case's inputs upcast."""
    args = spec.make_args(case, device)
    wide = {n: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for n, v in args.items()}
    with torch.no_grad():
        got = dict(zip(spec.outputs, spec.call(impl.op(spec.name), {n: _copy(v) for n, v in wide.items()})))
        hf = dict(zip(spec.outputs, spec.call(spec.reference, wide)))
    finite = [(got[n], hf[n]) for n in names if n in spec.outputs]
    return torch.cat([ulp_distance(k[k.isfinite() & h.isfinite()], h[k.isfinite() & h.isfinite()]).flatten()
                      for k, h in finite]) if finite else torch.zeros(0)


def _copy(value):
    return value.clone() if isinstance(value, torch.Tensor) else value


def measure(impl, op: str, dtype: str, seeds: int, device) -> str:
    spec = SPECS[op]
    names = [n for n, contract in impl.exact(spec).items() if contract == exact_check.ROUNDING]
    needed, distances, cases = 0, [], 0
    for stratified in spec.stratified(dtype, CPU_BUDGET):
        for seed in range(seeds):
            case = dataclasses.replace(stratified, seed=stratified.seed + 7919 * seed)
            prepared = engine.prepare(spec, case, device, maths=impl.maths(op))
            run = engine.run_impl(spec, case, impl, prepared, device)
            got = {**run.outputs, **run.grads}
            needed = next((s for s in STEPS if s >= needed and kept_with(s, spec, prepared, got, names)), 10**9)
            distances.append(float32_distances(spec, impl, case, names, device))
            cases += 1
    every = torch.cat(distances)
    top = f"{every.max():.0f}, 99.99%: {every.quantile(0.9999):.0f}" if every.numel() else "-"
    return (f"{op} {','.join(names)} {dtype}: {cases} cases, smallest K {needed if needed <= STEPS[-1] else '>64'}; "
            f"float32 distance in ULPs of the value: max {top} ({every.numel()} elements)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", default="kernels")
    parser.add_argument("--ops", default="", help="comma-separated; default: every op with a 'rounding' promise")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    impl = load(args.impl)
    ops = [o for o in args.ops.split(",") if o] or \
        [op for op in SPECS if impl.op(op) is not None and exact_check.ROUNDING in impl.exact(SPECS[op]).values()]
    kept = rounding.ROUNDING_ULPS
    for op in ops:
        for dtype in ("bfloat16", "float16"):
            print(measure(impl, op, dtype, args.seeds, args.device), flush=True)
    print(f"ROUNDING_ULPS is {kept}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
