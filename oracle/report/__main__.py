"""``python -m oracle.report``: sweep every spec x variant x dtype over a fixed, seeded grid of
shapes and layouts for ``--impl`` (``--scale`` adds the scale grid, on a GPU), then print a summary
table and write the JSON and the HTML dashboard. ``--baseline``/``--gate``/``--update-baseline`` compare with, gate on, or write the
stored baseline of this platform (reports/baseline-<platform>.json).

Exit status: 0 done (no regression under --gate), 1 a regression under --gate and nothing else, 2
a usage or environment error (a missing, malformed or foreign baseline, checked before the sweep; a
baseline sharing no cell with the run; an unknown op).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from oracle.cases import FLOAT_DTYPES
from oracle import engine
from oracle.engine.devices import native_gpu
from oracle.environment import (environment, platform_key, separate_compile_caches, shadowed_hub_kernels, write_json_atomic,
                           write_text_atomic)
from oracle.declare.implementations import ImplementationUnavailable, load
from oracle.declare.registry import SPECS
from oracle.declare.registry import DeclarationError, load_declared
from oracle.report import gate, html, results, shards, sweep, terminal

DEFAULT_BENCH = Path("reports/bench-h200.json")


def _declared_ops(argv) -> None:
    """Load --op-module's declarations first: --ops's choices are the registry's ops."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--op-module", action="append", default=[])
    known, _ = early.parse_known_args(argv)
    load_declared(known.op_module)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def parse(argv):
    _declared_ops(argv)
    parser = argparse.ArgumentParser(prog="python -m oracle.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", default="kernels", help="kernels (default), hf, compile, liger, unsloth, unsloth-inplace or package.module:attr")
    parser.add_argument("--op-module", action="append", default=[], metavar="MODULE",
                        help="a module of op declarations (oracle.declare.Op) to sweep like the built-in ops; repeatable")
    parser.add_argument("--noise-model", choices=("declared", "derived"),
                        help="derived (default): the noise model derived from the reference, everywhere; declared: each "
                             "op's hand-written noise model where it has one (ORACLE_NOISE_MODEL)")
    parser.add_argument("--full", action="store_true", help="the large grid (meant for a GPU)")
    parser.add_argument("--scale", action="store_true",
                        help="add the scale grid: the sizes people train at, up to 2^31 elements (needs a CUDA GPU)")
    parser.add_argument("--ops", nargs="+", metavar="OP", help=f"only these ops ({', '.join(sorted(SPECS))}, and "
                                                                "those of --op-module)")
    parser.add_argument("--dtypes", nargs="+", choices=FLOAT_DTYPES, help="only these dtypes")
    parser.add_argument("--variants", nargs="+", help="only these variants (llama, gemma, plain, packed, default)")
    parser.add_argument("--no-checks", action="store_true", help="skip the aliasing graph checks")
    parser.add_argument("--json", type=Path, help="where the JSON goes (default reports/out/drift-<platform>.json)")
    parser.add_argument("--html", type=Path, help="where the dashboard goes (default reports/out/drift-<platform>.html)")
    parser.add_argument("--bench", type=Path, help=f"benchmark JSON for the performance section (default {DEFAULT_BENCH} "
                                                   "when it exists)")
    parser.add_argument("--baseline", type=Path, help="compare with this run (default reports/baseline-<platform>.json)")
    parser.add_argument("--gate", action="store_true", help="exit 1 if any cell regressed against the baseline")
    parser.add_argument("--update-baseline", action="store_true", help="store this run as the platform's baseline")
    parser.add_argument("--workers", type=_positive, help="worker processes (default: the CPU cores, at most 8, or 2 per GPU)")
    parser.add_argument("--from-json", type=Path, help="render a stored run's table and dashboard again (no sweep)")
    parser.add_argument("--shard", metavar="K/N", help="run the K-th of N deterministic parts of the sweep (a CI job matrix)")
    parser.add_argument("--merge", nargs="+", type=Path, metavar="JSON",
                        help="join the shards' JSON files into one run (then --gate, --update-baseline as for a sweep)")
    args = parser.parse_args(argv)
    unknown = [op for op in args.ops or () if op not in SPECS]
    if unknown:  # argparse's own words, and where a declared op comes from
        parser.error(f"argument --ops: invalid choice: {unknown[0]!r} (choose from {', '.join(sorted(SPECS))}). "
                     "An op declared in your own repository needs its module: --op-module MODULE (repeatable), "
                     "the ini option oracle_op_modules, or ORACLE_OP_MODULES")
    if args.merge and (args.from_json or args.shard):
        parser.error("--merge joins stored shards: it takes neither --from-json nor --shard")
    return args


def main(argv=None) -> int:
    """Plan the run (a sweep now, a shard of one, or a stored run: --from-json, --merge), load the
    baseline it is compared with, then report, store the baseline (--update-baseline) and gate."""
    console = Console(width=None if sys.stdout.isatty() else 140)  # a log file gets the whole table
    try:
        args = parse(argv)
    except DeclarationError as exc:
        return _usage_error(console, exc)
    if (why := shadowed_hub_kernels()) is not None:
        return _usage_error(console, why)
    separate_compile_caches()  # the workers inherit it
    if args.noise_model:
        os.environ["ORACLE_NOISE_MODEL"] = args.noise_model  # the workers read it
    try:
        run = _plan(args)
        baseline = _baseline(args, run)
    except gate.BaselineError as exc:
        if not (args.update_baseline and not args.gate):
            return _usage_error(console, exc)
        # replacing a baseline of an older schema: nothing to compare with, the new one is written
        console.print(f"not compared with the old baseline: {exc}", highlight=False, soft_wrap=True)
        baseline = None
    except (ValueError, ImplementationUnavailable) as exc:
        return _usage_error(console, exc)

    document = _document(args, run, console)
    try:
        comparison = gate.compare(document, baseline, gate.Selection.of(args)) if baseline else None
    except gate.BaselineError as exc:
        return _usage_error(console, exc)
    if comparison is not None:
        document["baseline"] = {"path": str(run.baseline_path), "commit": baseline["environment"].get("commit"),
                                **comparison}
    _write_report(args, run, document, comparison, console)
    if args.update_baseline and (problem := _update_baseline(document, run, console)):
        return _usage_error(console, problem)
    if comparison is not None:
        terminal.print_verdict(comparison, console)
    return _gate_status(document, comparison, run.baseline_path, console) if args.gate else 0


@dataclass(frozen=True)
class _Run:
    """What a run reports on, decided before any sweep: a stored run (--from-json, --merge), or the
    tasks to sweep now (this shard's part of them with --shard)."""

    stored: dict | None
    shard: tuple[int, int] | None
    platform: str
    baseline_path: Path
    tasks: list | None
    planned: int | None  # how many tasks the whole sweep has, before --shard takes its part
    not_tested: dict  # op -> why: ops the implementation declares it lacks, listed and not swept


def _plan(args) -> _Run:
    """The stored run, or the implementation loaded and the tasks of the grid to sweep now."""
    shard = shards.parse(args.shard) if args.shard else None
    stored = _stored_run(args.from_json) if args.from_json else \
        shards.merge([_stored_run(p) for p in args.merge], [str(p) for p in args.merge]) if args.merge else None
    platform = stored["environment"]["platform"] if stored else platform_key()
    baseline_path = args.baseline or gate.default_baseline(platform)
    ops, not_tested = args.ops, {}
    if not stored:  # as pytest does: the ops asked must be there, declared lacks are listed, not swept
        implementation = load(args.impl)
        ops = implementation.select(args.ops)
        not_tested = {op: why for op, why in implementation.declared_lacking().items()
                      if implementation.op(op) is None and (args.ops is None or op in args.ops)}
    if args.scale and not stored and not native_gpu():
        raise ValueError("--scale needs a CUDA GPU: its cases hold up to 2^31 elements, days of work for "
                         "Triton's interpreter")
    tasks = None if stored else sweep.plan(args.full, ops, args.dtypes, args.variants, checks=not args.no_checks,
                                           at_scale=args.scale)
    planned = len(tasks) if tasks is not None else None
    if shard is not None:
        tasks = shards.select(tasks, *shard)
    return _Run(stored, shard, platform, baseline_path, tasks, planned, not_tested)


def _baseline(args, run: _Run) -> dict | None:
    """The baseline the run is compared with, where one is asked for (None otherwise); under --gate,
    checked against the run's cells before any sweep. Raises gate.BaselineError."""
    # --baseline names the run to compare with, and with --update-baseline also where to write;
    # a baseline about to be written for the first time has nothing to compare with yet.
    wanted = args.gate or (args.baseline and not args.update_baseline) or \
        (args.update_baseline and run.baseline_path.exists())
    noise_model = results.run_noise_model(run.stored) if run.stored else engine.noise_rule()
    baseline = gate.load_baseline(run.baseline_path, run.platform, noise_model) if wanted else None
    if baseline and args.gate:  # fail now, not after the sweep, when nothing could be judged
        _check_the_gate_can_judge(args, run, baseline)
    return baseline


def _check_the_gate_can_judge(args, run: _Run, baseline: dict) -> None:
    """The run shares cells with the baseline and, for a sweep, covers what the gate is asked to
    judge of it; raises gate.BaselineError."""
    run_keys = {(c.get("key"), c.get("identity")) for c in run.stored["cells"]} if run.stored else \
        results.cell_keys(run.tasks)
    gate.check_overlap(run_keys, baseline, run.baseline_path)
    if not run.stored:  # stored runs are judged after: compare() names what they lack
        problem = gate.coverage_problem(run_keys, {t.case.op for t in run.tasks}, baseline,
                                        gate.Selection.of(args), sweep.grid_name(args.full, args.scale), run.shard,
                                        run.baseline_path)
        if problem:
            raise gate.BaselineError(problem)


def _document(args, run: _Run, console: Console) -> dict:
    """The stored run, or the sweep run now; a shard's says which part of the sweep it holds."""
    document = run.stored or {**sweep_now(args, run.tasks, console), "not_tested": run.not_tested}
    if run.shard is not None:
        document["shard"] = {"index": run.shard[0], "count": run.shard[1], "tasks": len(run.tasks),
                             "planned": run.planned}
    return document


def _write_report(args, run: _Run, document: dict, comparison: dict | None, console: Console) -> None:
    """The JSON (not rewritten for a stored run unless asked), the dashboard and the terminal's table."""
    json_path = args.json or Path("reports/out") / f"drift-{run.platform}.json"
    html_path = args.html or Path("reports/out") / f"drift-{run.platform}.html"
    if not run.stored or args.json or args.merge:
        write_json_atomic(json_path, document)
    bench_path = args.bench or (DEFAULT_BENCH if DEFAULT_BENCH.exists() else None)
    bench = json.loads(bench_path.read_text()) if bench_path else None
    write_text_atomic(html_path, html.render(document, comparison, bench, updated=args.update_baseline))
    terminal.print_summary(document, comparison, console)
    console.print(f"wrote {json_path if not run.stored or args.json else ''} {html_path}", highlight=False)


def _update_baseline(document: dict, run: _Run, console: Console) -> str | None:
    """--update-baseline: the run stored as its platform's baseline; or why it was not."""
    view = results.baseline_view(document)
    problem = gate.baseline_problem(view, run.platform)
    if problem:  # never store a baseline that the next gate would refuse
        return f"not stored as the baseline {run.baseline_path}: {problem}"
    write_json_atomic(run.baseline_path, view)
    console.print(f"baseline updated: {run.baseline_path}", highlight=False)
    return None


def _gate_status(document: dict, comparison: dict, baseline_path: Path, console: Console) -> int:
    """--gate's exit status: 2 where it could not judge all it was asked to, 1 for a regression, else 0."""
    if not comparison["judged"]:
        return _usage_error(console, f"no cell of this run could be judged against the baseline {baseline_path}")
    missing = (document.get("shards") or {}).get("missing")
    if missing:
        count = document["shards"]["count"]
        return _usage_error(console, f"shard(s) {', '.join(f'{k}/{count}' for k in missing)} missing: their cells "
                                     "were not judged")
    if gate.unasked(comparison):
        return _usage_error(console, "the gate never passes what it did not judge: "
                                     f"{'; '.join(gate.unasked(comparison))} (against the baseline {baseline_path})")
    if comparison["regressions"]:
        return 1
    return 0


def _usage_error(console: Console, problem) -> int:
    """Exit 2, the gate could not judge: one line, so that CI logs show the whole sentence."""
    console.print(f"[red]error:[/] {escape(str(problem))}", highlight=False, soft_wrap=True)
    return 2


def _stored_run(path: Path) -> dict:
    try:
        document = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read the stored run {path}: {exc}") from exc
    if not isinstance(document, dict) or document.get("schema") != results.SCHEMA:
        raise ValueError(f"{path} is not a report of schema {results.SCHEMA!r}")
    return document


def sweep_now(args, tasks: list, console) -> dict:
    devices = sweep.default_workers()
    if args.workers:
        devices = (devices * args.workers)[:args.workers]
    start = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        bar = progress.add_task(f"{args.impl}: {len(tasks)} cases and checks on {len(devices)} worker(s)",
                                total=len(tasks))
        answers = sweep.run(tasks, args.impl, devices,
                            on_answer=lambda task, answer: progress.update(bar, advance=1,
                                                                           description=f"{args.impl}: {task.label}"))
    return results.build(tasks, answers, args.impl, sweep.grid_name(args.full, args.scale), environment(),
                         time.perf_counter() - start)


if __name__ == "__main__":
    sys.exit(main())
