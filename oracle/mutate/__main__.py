"""``python -m oracle.mutate``: mutation testing of the Triton kernels an implementation launches.

    python -m oracle.mutate --impl kernels --ops rms_norm
    python -m oracle.mutate --op-module mylib.declared --impl mylib.impls:impl --ops softmax --json mutants.json

It runs the implementation once on the generic suite's CI-profile cases, recording which kernel
statements each case runs (kernel coverage); makes every mutant of the kernels it launched
(oracle/mutate/operators.py); runs each mutant in a process of its own on the cases that reach its
statement, cheapest and most often killing first, until one fails; and reports the score and every
survivor, classed (oracle/mutate/score.py). With ``--baseline PATH`` (a stored report run) the
suite's survivors are then judged by the gate against it (oracle/mutate/gate.py). Exit status: 0
when every non-equivalent mutant was killed, 1 when some survived, 2 on bad usage, a baseline of
cases that already fails, or a --baseline the gate cannot judge with.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from oracle.mutate import operators as operator_catalogue


def parse(argv):
    """The command line, parsed (tests/test_docs.py checks the docs' commands with it)."""
    parser = argparse.ArgumentParser(prog="python -m oracle.mutate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", default="kernels", help="the implementation (as --impl of pytest and the report)")
    parser.add_argument("--op-module", action="append", default=[], metavar="MODULE",
                        help="a module of op declarations (repeatable), as for the report")
    parser.add_argument("--ops", default=None, help="comma-separated ops (default: every op the implementation provides)")
    parser.add_argument("--operators", default=None,
                        help="comma-separated mutation operators (default: all: " +
                        ", ".join(op.name for op in operator_catalogue.OPERATORS) + ")")
    parser.add_argument("--lines", default=None, metavar="LINES",
                        help="comma-separated lines of the kernel files, each N or FILE:N (FILE the end of the "
                             "file's path, as kernels/rms_norm.py or rms_norm.py): only the mutants whose edit "
                             "starts there (default: every line)")
    parser.add_argument("--workers", type=int, default=None, help="processes at once (default: the cores)")
    parser.add_argument("--limit", type=int, default=None, help="test only the first N mutants (a quick look)")
    parser.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                        help="start no mutant after this many seconds; those left are reported as not run")
    parser.add_argument("--json", default=None, metavar="PATH", help="write every mutant and its class here")
    parser.add_argument("--dtypes", default=None, help="comma-separated dtypes of the cases (default: all three)")
    parser.add_argument("--no-float64", action="store_true", help="leave out the float64 checks")
    parser.add_argument("--baseline", default=None, metavar="PATH",
                        help="a stored report run (python -m oracle.report --update-baseline): a mutant every suite "
                             "case passes is then judged by the gate against it, as python -m oracle.report --gate "
                             "judges a run, and a regression kills it")
    return parser.parse_args(argv)


def _fail(message: str) -> int:
    print(f"oracle.mutate: {message}", file=sys.stderr)
    return 2


def lines_wanted(text: str | None) -> tuple[tuple[str | None, int], ...] | None:
    """--lines as (file ending or None, line) pairs; None where not given. Raises ValueError."""
    if text is None:
        return None
    wanted = []
    for entry in (e.strip() for e in text.split(",")):
        file, _, line = entry.rpartition(":")
        if not line.isdigit() or int(line) < 1:
            raise ValueError(f"--lines takes N or FILE:N (N a line number from 1), got {entry!r}")
        wanted.append((file or None, int(line)))
    return tuple(wanted)


def _progress(total: int, started: float):
    """A one-line progress bar on a terminal; a line every tenth of the way otherwise."""
    shown = {"step": -1}

    def show(answers: dict) -> None:
        done = len(answers)
        counts = Counter("killed" if getattr(a, "status", "pass") != "pass" else "ran" for a in answers.values())
        text = (f"[{'#' * (30 * done // max(total, 1)):<30}] {done}/{total} mutants, {counts['killed']} killed "
                f"so far, {time.monotonic() - started:.0f} s")
        if sys.stderr.isatty():
            print("\r" + text, end="" if done < total else "\n", file=sys.stderr, flush=True)
        elif 10 * done // max(total, 1) > shown["step"]:
            shown["step"] = 10 * done // max(total, 1)
            print(text, file=sys.stderr, flush=True)
    return show


def main(argv=None) -> int:
    args = parse(argv)
    from oracle import interpreter

    interpreter.choose_backend()
    from oracle.declare.registry import SPECS, load_declared
    from oracle.engine.devices import case_budget, native_gpu
    from oracle.errors import DeclarationError

    try:
        load_declared(args.op_module)
    except (DeclarationError, ImportError) as exc:
        return _fail(str(exc))
    ops = [o.strip() for o in args.ops.split(",")] if args.ops else list(SPECS)
    unknown = [o for o in ops if o not in SPECS]
    if unknown:
        return _fail(f"unknown op(s) {', '.join(unknown)}; declared: {', '.join(SPECS)}")
    chosen = [o.strip() for o in args.operators.split(",")] if args.operators else list(operator_catalogue.BY_NAME)
    stray = [o for o in chosen if o not in operator_catalogue.BY_NAME]
    if stray:
        return _fail(f"unknown operator(s) {', '.join(stray)}; known: {', '.join(operator_catalogue.BY_NAME)}")
    try:
        lines = lines_wanted(args.lines)
    except ValueError as exc:
        return _fail(str(exc))
    if args.workers is not None and args.workers < 1:
        return _fail("--workers must be at least 1")
    if args.time_limit is not None and args.time_limit <= 0:
        return _fail("--time-limit must be a positive number of seconds")
    from oracle.cases import FLOAT_DTYPES

    dtypes = tuple(d.strip() for d in args.dtypes.split(",")) if args.dtypes else FLOAT_DTYPES
    if not dtypes or any(d not in FLOAT_DTYPES for d in dtypes):
        return _fail(f"--dtypes takes some of {', '.join(FLOAT_DTYPES)}, got {args.dtypes!r}")
    gate = None
    if args.baseline is not None:  # refused here, before any mutant runs, as the report's gate refuses it
        from oracle.engine import noise_rule
        from oracle.environment import platform_key
        from oracle.errors import BaselineError
        from oracle.mutate.gate import plan

        try:
            gate = plan(args.baseline, ops, platform_key(), noise_rule())
        except BaselineError as exc:
            return _fail(f"--baseline: {exc}")
    from oracle.mutate.session import Session

    session = Session(args.impl, ops, chosen, args.workers, native_gpu(), case_budget(), dtypes,
                      float64=not args.no_float64, op_modules=tuple(args.op_module), time_limit=args.time_limit,
                      gate=gate, lines=lines)
    return session.run(args.limit, args.json, _progress)


if __name__ == "__main__":
    sys.exit(main())
