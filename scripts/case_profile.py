"""Where one op's cases spend their time, on this machine's device: the op's first stratified cases
(or, with --drawn, the cases hypothesis draws at this device's budget, as the suite's tests do)
through the engine, the wall time of each, then cProfile's top entries.

    python scripts/case_profile.py --op dyt --op-module peers.liger.ops --impl peers.liger.impl:impl
    ORACLE_NOISE_MODEL=declared python scripts/case_profile.py --op rms_norm --impl hf --drawn 30 --sort tottime

The first case pays for imports and the first compiles; the rest show what every drawn case costs
(on a GPU, a kernel specialised on a width compiles anew for every new width).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

from hypothesis import HealthCheck, given, settings

from oracle.engine.devices import case_budget, default_device
from oracle.engine import noise_rule, run_case
from oracle.declare.implementations import load
from oracle.declare.registry import SPECS
from oracle.declare.registry import load_declarations


def drawn(spec, dtype: str, count: int) -> list:
    """The first ``count`` cases hypothesis draws for the spec's test in ``dtype`` (derandomized, so the
    same cases every run)."""
    cases = []

    @settings(max_examples=count, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case=spec.cases(case_budget(), (dtype,)))
    def collect(case):
        cases.append(case)

    collect()
    return cases[:count]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", required=True)
    parser.add_argument("--impl", default="kernels")
    parser.add_argument("--op-module", action="append", default=[])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--cases", type=int, default=6)
    parser.add_argument("--drawn", type=int, default=0, help="this many hypothesis-drawn cases instead")
    parser.add_argument("--sort", default="cumulative", help="cProfile's order: cumulative, tottime, ...")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    load_declarations(*args.op_module)
    if args.op not in SPECS:
        print(f"unknown op {args.op}", file=sys.stderr)
        return 2
    impl, device = load(args.impl), default_device()
    spec = SPECS[args.op]
    if args.drawn:
        cases = drawn(spec, args.dtype, args.drawn)
    else:
        cases = spec.stratified(args.dtype, case_budget())[:args.cases]
    profile, total = cProfile.Profile(), 0.0
    for case in cases:
        start = time.perf_counter()
        profile.enable()
        result = run_case(args.op, case, impl, device)
        profile.disable()
        elapsed = time.perf_counter() - start
        total += elapsed
        print(f"{elapsed:7.2f} s  {result.status:<5} {case.label}", flush=True)
    print(f"{total:.1f} s for {len(cases)} cases under the {noise_rule()} noise model", flush=True)
    pstats.Stats(profile).sort_stats(args.sort).print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
