"""``python -m oracle.bench --plot RUN.json --out FIGURE.svg``: a stored benchmark run's column sweep as one
SVG figure, on any machine (no GPU; Matplotlib from the ``report`` extra).

One column per swept variant (RMSNorm: Llama, Gemma). Top: forward GPU bandwidth as a fraction of the copy's,
with the targets' 85% and 70% lines. Bottom: forward+backward GPU time over the faster of torch.compile's and
Liger's, with the target's 1.0 line; HF eager (about 10x) is left out there, it would flatten the others onto
the line. The SVG is deterministic for a given run (fixed hash salt, text as text, no date), so it can be committed.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from oracle.bench.targets import FAST_PEERS, FWD_BWD_TARGET, FWD_TARGET, FWD_TARGET_NARROW, SCHEMA
from oracle.environment import write_text_atomic
from oracle.errors import BenchFileError  # noqa: F401 - raised here

FORWARD_LINES = ("kernels", "compile", "liger", "eager")
FWD_BWD_LINES = ("kernels", "compile", "liger")
COLOURS = {"kernels": "C0", "compile": "C1", "liger": "C2", "eager": "C3"}
SVG_STYLE = {"svg.hashsalt": "kernel-oracle", "svg.fonttype": "none"}  # stable ids; fonts not embedded as paths



def load_sweep(path: Path) -> dict:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise BenchFileError(f"cannot read it: {exc.strerror or exc}") from None
    try:
        run = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BenchFileError(f"not JSON: {exc}") from None
    if not isinstance(run, dict) or run.get("schema") != SCHEMA:
        found = run.get("schema") if isinstance(run, dict) else type(run).__name__
        raise BenchFileError(f"schema {found!r}, expected {SCHEMA!r}")
    if not run.get("column_sweep"):
        raise BenchFileError("it holds no column sweep (a --quick or --no-sweep run?)")
    if not run.get("copy_tbps"):
        raise BenchFileError("it holds no copy bandwidth")
    return run


def _panels(sweep: list[dict], copy_tbps: float) -> dict[tuple[str, str], dict[str, dict[str, list]]]:
    """(op, variant) -> {"fwd": {line: [(width, fraction of copy)]}, "fwd_bwd": {line: [(width, over fastest)]}},
    a line per implementation (and dtype, where the sweep has several)."""
    groups: dict[tuple, dict[str, dict]] = {}
    for t in sweep:
        groups.setdefault((t["op"], t["op_variant"], t["width"], t["dtype"]), {})[t["impl"]] = t
    several_dtypes = len({t["dtype"] for t in sweep}) > 1
    panels: dict[tuple[str, str], dict[str, dict[str, list]]] = {}
    for (op, variant, width, dtype), impls in groups.items():
        panel = panels.setdefault((op, variant), {"fwd": {}, "fwd_bwd": {}})
        peers = [impls[name]["fwd_bwd_gpu_ms"] for name in FAST_PEERS
                 if name in impls and impls[name].get("fwd_bwd_gpu_ms")]
        for impl, t in impls.items():
            line = f"{impl} ({dtype})" if several_dtypes else impl
            if impl in FORWARD_LINES and t.get("fwd_gpu_ms"):
                fraction = t["fwd_bytes"] / (t["fwd_gpu_ms"] * 1e-3) / 1e12 / copy_tbps
                panel["fwd"].setdefault(line, []).append((width, fraction))
            if impl in FWD_BWD_LINES and t.get("fwd_bwd_gpu_ms") and peers:
                panel["fwd_bwd"].setdefault(line, []).append((width, t["fwd_bwd_gpu_ms"] / min(peers)))
    return panels


def _line_order(line: str) -> int:
    impl = line.split(" ")[0]
    return FORWARD_LINES.index(impl) if impl in FORWARD_LINES else len(FORWARD_LINES)


def _width_label(width: int) -> str:
    return f"{width // 1024}k" if width >= 1024 and width % 1024 == 0 else str(width)


def render(run: dict) -> str:
    """The figure as SVG text."""
    import matplotlib

    matplotlib.use("Agg")  # no display: render to files only
    import matplotlib.pyplot as plt

    sweep = run["column_sweep"]
    panels = _panels(sweep, run["copy_tbps"])
    widths = sorted({t["width"] for t in sweep})
    with matplotlib.rc_context(SVG_STYLE):
        fig, axes = plt.subplots(2, len(panels), figsize=(5.2 * len(panels), 6.4), sharex=True, squeeze=False)
        for column, ((op, variant), panel) in enumerate(panels.items()):
            top, bottom = axes[0][column], axes[1][column]
            for ax, phase in ((top, "fwd"), (bottom, "fwd_bwd")):
                for line, points in sorted(panel[phase].items(), key=lambda item: _line_order(item[0])):
                    points.sort()
                    ax.plot([w for w, _ in points], [v for _, v in points], marker="o", markersize=3,
                            label=line, color=COLOURS.get(line.split(" ")[0]))
                ax.grid(alpha=0.3)
            top.axhline(FWD_TARGET, color="black", linestyle="--", linewidth=0.8,
                        label=f"target {FWD_TARGET:.0%} ({FWD_TARGET_NARROW:.0%} narrow)")
            top.axhline(FWD_TARGET_NARROW, color="grey", linestyle="--", linewidth=0.8)
            top.set_ylim(0, max([1.1, *(v for points in panel["fwd"].values() for _, v in points)]))
            top.set_title(f"{op} {variant}", fontsize=10)
            bottom.axhline(FWD_BWD_TARGET, color="black", linestyle="--", linewidth=0.8)
            bottom.set_xscale("log", base=2)
            bottom.set_xticks(widths, [_width_label(w) for w in widths], fontsize=7)
            bottom.minorticks_off()
            bottom.set_xlabel("columns (same element count at every width)")
        # one legend below the panels, where it covers no line; every panel draws the same implementations
        handles = {label: handle for ax in axes[0] for handle, label in zip(*ax.get_legend_handles_labels())}
        fig.legend(handles.values(), handles.keys(), loc="upper center", bbox_to_anchor=(0.5, 0.02),
                   ncol=len(handles), fontsize=8, frameon=False)
        axes[0][0].set_ylabel("forward GPU bandwidth / copy's")
        axes[1][0].set_ylabel("fwd+bwd GPU time /\nfaster of compile, Liger")
        device = run.get("environment", {}).get("device", "")
        fig.suptitle(f"column sweep, {device}, copy {run['copy_tbps']:.2f} TB/s (CUDA-graph replay; "
                     f"eager left out below)", fontsize=10)
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
        plt.close(fig)
    return buffer.getvalue()


def plot_columns(path: Path, out: Path) -> Path:
    """Read a stored run (BenchFileError where it cannot be plotted) and write its figure to ``out``."""
    write_text_atomic(out, render(load_sweep(path)))
    return out
