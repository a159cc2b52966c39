"""``python -m oracle.sanitize --impl NAME``: every op of an implementation, on the report's quick
grid, under compute-sanitizer's memcheck, racecheck, initcheck and synccheck; one line per op and
tool when clean, one per distinct finding otherwise, each run's full log under reports/out/sanitize/.

Exit status: 0 every run clean; 1 a finding, or a run that failed without one (an error line: it is
not clean); 2 a usage or environment error (no CUDA GPU, no compute-sanitizer, an unknown op, an
implementation that cannot be loaded).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from oracle.environment import write_json_atomic
from oracle.declare.implementations import ImplementationUnavailable, load
from oracle.declare.registry import ENVIRONMENT, DeclarationError, load_declared
from oracle.sanitize import runner
from oracle.sanitize.runner import TOOLS, Run

NO_GPU = "needs a CUDA GPU: compute-sanitizer checks device code"
INTERPRETED = ("TRITON_INTERPRET is set: Triton would run the kernels on the CPU, where compute-sanitizer sees "
               "nothing; unset it")
NO_SANITIZER = ("compute-sanitizer not found on PATH, in $CUDA_HOME/bin or in /usr/local/cuda/bin: install the CUDA "
                "toolkit's, or put its directory on PATH")
STYLES = {"clean": "green", "findings": "red", "error": "red", "not tested": "yellow"}


def _jobs(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def parse(argv):
    parser = argparse.ArgumentParser(prog="python -m oracle.sanitize", description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", default="kernels", help="kernels (default), hf, liger, ... or package.module:attr")
    parser.add_argument("--ops", nargs="+", metavar="OP", help="only these ops (default: every op it provides)")
    parser.add_argument("--op-module", action="append", default=[], metavar="MODULE",
                        help="a module of op declarations (oracle.declare.Op) to sanitize like the built-in ops; repeatable")
    parser.add_argument("--tools", nargs="+", choices=TOOLS, default=list(TOOLS), help="default: all four")
    parser.add_argument("--jobs", type=_jobs, default=runner.default_jobs(),
                        help=f"sanitizer processes at once (default min(8, CPU cores): {runner.default_jobs()})")
    parser.add_argument("--json", type=Path, help="also write the runs and their findings here")
    return parser.parse_args(argv)


def environment_problem() -> tuple[str | None, Path | None]:
    """(why this machine cannot run the sanitizer, or None; compute-sanitizer's path)."""
    import torch

    from oracle.engine.devices import native_gpu

    if not torch.cuda.is_available():
        return NO_GPU, None
    if not native_gpu():
        return INTERPRETED, None
    sanitizer = runner.find_compute_sanitizer()
    return (None, sanitizer) if sanitizer else (NO_SANITIZER, None)


def main(argv=None) -> int:
    args = parse(argv)
    console = Console(width=None if sys.stdout.isatty() else 160)  # a log file gets whole lines
    if args.op_module:  # the targets are processes of their own: they load the declarations from the environment
        os.environ[ENVIRONMENT] = ",".join(filter(None, [os.environ.get(ENVIRONMENT, ""), *args.op_module]))
    try:
        load_declared()
    except DeclarationError as exc:
        return _usage_error(console, exc)
    try:  # as the report does: the ops asked must be there; declared lacks are listed, not run
        implementation = load(args.impl)
        ops = implementation.select(args.ops)
    except (ValueError, ImplementationUnavailable) as exc:
        return _usage_error(console, exc)
    not_tested = {} if args.ops else {op: why for op, why in implementation.declared_lacking().items()
                                      if implementation.op(op) is None}
    problem, sanitizer = environment_problem()
    if problem:
        return _usage_error(console, problem)

    tools = list(dict.fromkeys(args.tools))
    start = time.perf_counter()
    # A SIGTERM (a CI timeout) unwinds like Ctrl-C, so that run_all stops the sanitizer processes,
    # which run in sessions of their own and would otherwise outlive the command.
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as progress:
            bar = progress.add_task(f"{args.impl}: {len(ops)} op(s) x {len(tools)} tool(s), {args.jobs} at a time",
                                    total=len(ops) * len(tools))
            runs = runner.run_all(sanitizer, args.impl, ops, tools, args.jobs, on_done=lambda run: progress.update(
                bar, advance=1, description=f"{args.impl}: {run.op} {run.tool} {run.status}"))
            progress.update(bar, description=f"{args.impl}: {len(ops)} op(s) x {len(tools)} tool(s)")
    finally:
        signal.signal(signal.SIGTERM, previous)
    seconds = time.perf_counter() - start

    lines = report_lines(runs, not_tested)
    for text, status in lines:
        console.print(escape(text), style=STYLES[status], highlight=False, soft_wrap=True)
    summary = summary_line(args.impl, runs, not_tested, seconds)
    console.print(escape(summary), highlight=False, soft_wrap=True)
    status = 1 if any(run.status != "clean" for run in runs) else 0
    if args.json:
        write_json_atomic(args.json, {"impl": args.impl, "ops": ops, "tools": tools, "jobs": args.jobs,
                                      "sanitizer": str(sanitizer), "seconds": round(seconds, 1), "exit": status,
                                      "not_tested": not_tested, "summary": summary,
                                      "lines": [text for text, _ in lines], "runs": [run.to_dict() for run in runs]})
    return status


def report_lines(runs: list[Run], not_tested: dict[str, str]) -> list[tuple[str, str]]:
    """(line, status) per clean run, per distinct finding, per failed run (then its last lines),
    and per op not tested."""
    width = max(map(len, [run.op for run in runs] + list(not_tested)), default=0)
    lines = []
    for run in runs:
        head = f"{run.op:<{width}} {run.tool:<10} "
        if run.status == "clean":
            lines.append((f"{head}clean ({run.cases} cases, {run.seconds:.1f} s)", "clean"))
        elif run.status == "findings":
            lines += [(f"{head}{finding.describe()}  log: {run.log}", "findings") for finding in run.findings]
        else:
            lines.append((f"{head}error: {run.error}  log: {run.log}", "error"))
            lines += [(f"{'':<{width}} {'':<10}   | {text}", "error") for text in run.tail]
    lines += [(f"{op:<{width}} {'-':<10} not tested: {why}", "not tested") for op, why in not_tested.items()]
    return lines


def summary_line(impl: str, runs: list[Run], not_tested: dict[str, str], seconds: float) -> str:
    ops, tools = len({run.op for run in runs}), len({run.tool for run in runs})
    clean = sum(run.status == "clean" for run in runs)
    with_findings = [run for run in runs if run.status == "findings"]
    failed = sum(run.status == "error" for run in runs)
    distinct = sum(len(run.findings) for run in with_findings)
    lacking = f"; not tested: {', '.join(not_tested)}" if not_tested else ""
    return (f"{impl}: {len(runs)} runs ({ops} op(s) x {tools} tool(s)) in {seconds:.0f} s: "
            f"{clean} clean, {len(with_findings)} with findings ({distinct} distinct), {failed} failed{lacking}")


def _terminated(signum, frame):
    raise SystemExit(128 + signum)


def _usage_error(console: Console, problem) -> int:
    """Exit 2: one line, so that a CI log shows the whole sentence."""
    console.print(f"[red]error:[/] {escape(str(problem))}", highlight=False, soft_wrap=True)
    return 2


if __name__ == "__main__":
    sys.exit(main())
