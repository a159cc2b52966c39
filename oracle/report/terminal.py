"""The report's terminal output: a summary table per op, dtype and tensor, the kernel coverage per
op, the failures with their repro commands, the regressions against a baseline, and the gate's last
line."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from oracle.kernel_coverage import summary_lines
from oracle.report import gate


def _of_bound(fraction: float | None) -> str:
    """A judgement's worst value as a share of its bound (or allowance): above 100% fails."""
    if fraction is None:
        return "-"
    return f"[{'green' if fraction <= 1 else 'red'}]{fraction:.0%}[/]"


def print_summary(document: dict, comparison: dict | None, console: Console) -> None:
    took = f", {document['seconds']:.0f} s" if "seconds" in document else ""  # a baseline has no timings
    table = Table(title=f"kernel-oracle drift: {document['impl']} on {document['environment']['platform']} "
                        f"({document['sweep']} sweep{took})")
    # the op column takes the longest name whole: ops often differ only by a suffix (rms_norm, rms_norm_gated)
    longest = max((len(row["op"]) for row in document["summary"]), default=0)
    table.add_column("op", min_width=max(longest, len("op")), no_wrap=True)
    for column in ("variant", "dtype", "tensor", "passed", "worst ratio", "worst element", "typical excess",
                   "min bit-identical", "max ULP", "findings"):
        table.add_column(column, justify="right" if column not in ("variant", "dtype", "tensor") else "left")
    for row in document["summary"]:
        ok = row["passed"] == row["cells"]
        table.add_row(row["op"], row["variant"], row["dtype"], row["tensor"],
                      f"[{'green' if ok else 'red'}]{row['passed']}/{row['cells']}[/]", f"{row['worst_ratio']:.3g}",
                      _of_bound(row.get("worst_element")), _of_bound(row.get("worst_typical")),
                      f"{row['min_bit_identical']:.1%}", f"{row['max_ulp']:.0f}",
                      f"[{'green' if not row['findings'] else 'red'}]{row['findings']}[/]")
    console.print(table)
    console.print(maths_line(document), highlight=False, soft_wrap=True)
    checks = document["aliasing"]
    flagged = [c for c in checks if c["findings"]]
    console.print(f"aliasing checks: {len(checks) - len(flagged)}/{len(checks)} clean")
    print_kernel_coverage(document, console)
    for op, why in document.get("not_tested", {}).items():
        console.print(f"not tested: {op}: {document['impl']} declares it lacks it ({why})", highlight=False,
                      soft_wrap=True)
    for failure in document["failures"][:20]:
        console.print(f"[red]{failure['status']}[/]: {failure['summary']}\n  rerun: {failure['repro']}",
                      highlight=False, soft_wrap=True)
    if len(document["failures"]) > 20:
        console.print(f"... and {len(document['failures']) - 20} more failures in the JSON")
    if comparison is not None and comparison["regressions"]:
        console.print(f"[red]{len(comparison['regressions'])} regression(s) against the baseline:[/]")
        for line in comparison["regressions"][:30]:
            console.print("  " + escape(line), highlight=False, soft_wrap=True)
        if len(comparison["regressions"]) > 30:
            console.print(f"  ... and {len(comparison['regressions']) - 30} more in the JSON")
    drift = (comparison or {}).get("drift") or []
    if drift:
        console.print(f"{len(drift)} cell(s) changed within their verdicts (drift, not regressions: their error "
                      "ratio and bit-identity to HF moved, their precision did not):")
        for line in drift[:10]:
            console.print("  " + escape(line), highlight=False, soft_wrap=True)
        if len(drift) > 10:
            console.print(f"  ... and {len(drift) - 10} more in the JSON")


def print_kernel_coverage(document: dict, console: Console) -> None:
    """Per op, each Triton kernel its cases launched (oracle/kernel_coverage/summary.py); the lines
    never reached stand out. Nothing for a run without it (before the key, or no Triton kernel)."""
    for line in summary_lines(document.get("kernel_coverage") or {}):
        style = "red" if line.lstrip().startswith("never reached") else None
        console.print(escape(line), style=style, highlight=False, soft_wrap=True)


def maths_line(document: dict) -> str:
    """Which rule judged the run (oracle/noise/rounding.py, Note [Fast maths]), and the tensors that
    passed only in the room of fast maths."""
    measured = [c for c in document["cells"] if c.get("metrics")]
    rules = sorted({c["metrics"].get("maths", "exact") for c in measured})
    needed = sorted({f"{c['op']}/{c['variant']}/{c['dtype']}/{c['tensor']}" for c in measured
                     if c["metrics"].get("needed_fast_maths")})
    rule = " and ".join(rules) or "none"
    line = f"maths: {rule} (fast: exp as Triton's tl.exp is granted; exact: the implementation declares EXACT_MATHS)"
    if needed:
        line += f"; {len(needed)} tensor(s) passed only in the room of fast maths: {', '.join(needed[:8])}" + \
            (" ..." if len(needed) > 8 else "")
    return line


def print_verdict(comparison: dict, console: Console) -> None:
    """The gate's last line (gate.verdict_line), red when something regressed."""
    colour = "red" if comparison["regressions"] else "green"
    console.print(f"[{colour}]{escape(gate.verdict_line(comparison))}[/]", highlight=False, soft_wrap=True)
