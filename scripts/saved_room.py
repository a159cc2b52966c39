"""Where tests/sixteen_bit_norm.py's builds sit against the verdict with and without the rounding point
SAVED_IN_INPUT_DTYPE (oracle/noise/saved.py): per build, dtype, kind of incoming gradient and seed, the
case's status and dX's largest per-element error in scales (the bound is 2), and whether it needed
the room. The numbers docs/design.md §3 quotes.

    python scripts/saved_room.py
"""

from __future__ import annotations

import dataclasses

import oracle
from oracle import engine, implementation
from oracle.cases import CPU_BUDGET
from oracle.declare.implementations import Implementation, prepared
from oracle.engine.devices import default_device

BUILDS = ("correct", "saved_output", "saved_output_undeclared", "sixteen_bit_sum", "sixteen_bit_sum_declared")


def main() -> None:
    oracle.load_declarations("tests.sixteen_bit_norm")
    module = prepared("tests.sixteen_bit_norm")
    spec = module.WIDE_RMS_NORM.spec
    declared_sum = implementation(wide_rms_norm=module.sixteen_bit_sum.wide_rms_norm, NO_FLOAT64={"wide_rms_norm"},
                                  SAVED_IN_INPUT_DTYPE=True)
    print(f"{'build':26s} {'dtype':9s} {'gradient':14s} seed status dX element needed")
    for build in BUILDS:
        impl = Implementation(build, declared_sum if build == "sixteen_bit_sum_declared" else getattr(module, build))
        for dtype in ("float16", "bfloat16"):
            first = spec.stratified(dtype, CPU_BUDGET)[0]
            for kind in ("normal", "aligned", "aligned_noisy"):
                for seed in range(2):
                    case = dataclasses.replace(first, dims={"rows": 8, "cols": 256}, values="normal", seed=seed,
                                               layout="contiguous", grad_layout="contiguous", grad_values=kind)
                    result = engine.run_case(spec, case, impl, default_device())
                    dx = next(v for v in result.verdicts if v.name == "dX")
                    print(f"{build:26s} {dtype:9s} {kind:14s} {seed:4d} {result.status:6s} "
                          f"{dx.element_max:10.2f} {'yes' if dx.needed_saved_room else ''}")


if __name__ == "__main__":
    main()
