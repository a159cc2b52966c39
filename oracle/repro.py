"""``python -m oracle.repro [--impl NAME] [--check CHECK | --float64] '<case json>'``: rerun exactly one case.

Every failure the tests or the report print ends with this command. Without ``--check`` it runs
the differential comparison (with the aliasing checks that come with it); with it, one of the
graph checks of oracle/checks/aliasing.py; with ``--float64``, the float64 check of a float64 case
(the forward against the float64 truth, and gradcheck). Exit status: 0 pass, 1 fail/error, 2 bad usage.
"""

from __future__ import annotations

import argparse
import sys

from oracle.checks import aliasing
from oracle.cases import Case
from oracle.engine.devices import default_device
from oracle.engine import Float64Failure, check_float64, run_case
from oracle.environment import separate_compile_caches
from oracle.declare.implementations import ImplementationUnavailable, load
from oracle.declare.registry import SPECS
from oracle.declare.registry import DeclarationError, load_declared


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m oracle.repro", description=__doc__.splitlines()[0])
    parser.add_argument("case", help="the case as printed by a failure (JSON)")
    parser.add_argument("--impl", default="kernels", help="kernels, hf, compile, liger, unsloth, unsloth-inplace or package.module:attr")
    parser.add_argument("--device", default=None, help="torch device (default: the harness's, a GPU if there is one, else the CPU)")
    parser.add_argument("--check", default=None, choices=sorted(aliasing.CHECKS), help="run one aliasing check")
    parser.add_argument("--float64", action="store_true",
                        help="run the float64 check of a float64 case (the forward against the float64 truth and "
                             "gradcheck, or a raw kernel against HF's formula)")
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
    if args.float64:
        return _float64(SPECS[case.op], case, impl, device)
    if args.check:
        findings = aliasing.run_check(args.check, SPECS[case.op], case, impl, device)
        print(f"{'FAIL' if findings else 'PASS'}: {args.check} on {case.summary()}  [impl {impl.name}]")
        for finding in findings:
            print("  " + finding.describe())
        return 1 if findings else 0
    result = run_case(case.op, case, impl, device)
    print(result.explain())
    return 0 if result.passed else 1


def _float64(spec, case: Case, impl, device) -> int:
    if case.dtype != "float64":
        print(f"error: --float64 reruns a float64 case; this one is {case.dtype}", file=sys.stderr)
        return 2
    if not impl.takes_float64(spec.name):
        print(f"SKIP: float64 check of {case.summary()}  [impl {impl.name}]: it declares no float64 path (NO_FLOAT64)")
        return 0
    try:
        check_float64(spec, case, impl, device)
    except Float64Failure as exc:
        print(f"FAIL: {exc}")
        return 1
    except Exception as exc:  # noqa: BLE001 - the implementation's own error, with the notes check_float64 added
        notes = getattr(exc, "__notes__", [])
        print(f"FAIL: {notes[0] if notes else case.summary()}: {type(exc).__name__}: {exc}")
        print("\n".join(f"  {note}" for note in notes[1:]))
        return 1
    print(f"PASS: float64 check of {case.summary()}  [impl {impl.name}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
