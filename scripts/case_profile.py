"""Where one op's cases spend their time, on this machine's device: the op's first stratified cases
through the engine (as the suite runs each), the wall time of each, then cProfile's top entries.

    python scripts/case_profile.py --op dyt --op-module peers.liger.ops --impl peers.liger.impl:impl

The first case pays for imports and the first compiles; the rest show what every drawn case costs
(on a GPU, a kernel specialised on a width compiles anew for every new width).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

from oracle.devices import case_budget, default_device
from oracle.engine import run_case
from oracle.impls import load
from oracle.ops import SPECS
from oracle.registry import load_declarations


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", required=True)
    parser.add_argument("--impl", default="kernels")
    parser.add_argument("--op-module", action="append", default=[])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--cases", type=int, default=6)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    load_declarations(*args.op_module)
    if args.op not in SPECS:
        print(f"unknown op {args.op}", file=sys.stderr)
        return 2
    impl, device = load(args.impl), default_device()
    cases = SPECS[args.op].stratified(args.dtype, case_budget())[:args.cases]
    profile = cProfile.Profile()
    for case in cases:
        start = time.perf_counter()
        profile.enable()
        result = run_case(args.op, case, impl, device)
        profile.disable()
        print(f"{time.perf_counter() - start:7.2f} s  {result.status:<5} {case.label}", flush=True)
    pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
