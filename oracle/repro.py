"""``python -m oracle.repro [--impl NAME] [--check CHECK] '<case json>'``: rerun exactly one case.

Every failure the tests or the report print ends with this command. Without ``--check`` it runs
the differential comparison (with the aliasing checks that come with it); with it, one of the
graph checks of oracle/aliasing.py. Exit status: 0 pass, 1 fail/error, 2 bad usage.
"""

from __future__ import annotations

import argparse
import sys

from . import aliasing
from .cases import Case
from .devices import default_device
from .engine import run_case
from .environment import separate_compile_caches
from .impls import ImplementationUnavailable, load
from .ops import SPECS
from .registry import DeclarationError, load_declared


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m oracle.repro", description=__doc__.splitlines()[0])
    parser.add_argument("case", help="the case as printed by a failure (JSON)")
    parser.add_argument("--impl", default="kernels", help="kernels, hf, compile, liger, unsloth, unsloth-inplace or package.module:attr")
    parser.add_argument("--device", default=None, help="torch device (default: the harness's, a GPU if there is one, else the CPU)")
    parser.add_argument("--check", default=None, choices=sorted(aliasing.CHECKS), help="run one aliasing check")
    parser.add_argument("--op-module", action="append", default=[], metavar="MODULE",
                        help="a module of op declarations the case's op comes from")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    separate_compile_caches()
    try:
        load_declared(args.op_module)
        case = Case.from_json(args.case)
        if case.op not in SPECS:
            raise ValueError(f"unknown op {case.op!r}; known: {', '.join(SPECS)}")
        impl = load(args.impl)
    except (ValueError, ImplementationUnavailable, DeclarationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    device = args.device or default_device()
    if args.check:
        findings = aliasing.run_check(args.check, SPECS[case.op], case, impl, device)
        print(f"{'FAIL' if findings else 'PASS'}: {args.check} on {case.summary()}  [impl {impl.name}]")
        for finding in findings:
            print("  " + finding.describe())
        return 1 if findings else 0
    result = run_case(case.op, case, impl, device)
    print(result.explain())
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
