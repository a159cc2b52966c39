"""The self-contained HTML dashboard: a Jinja2 template with Matplotlib figures embedded as SVG.

One file that opens offline: every plot is an <img> whose source is a base64 data URI, the styles
are inline, and there is no script. Plots: error ratio to HF per op x dtype x tensor, bit-identity
to HF, ULP-distance histograms, error against column count, and (when a benchmark is given) the
performance section. Kernel coverage: per op, each Triton kernel's source in a collapsible block,
lines run and lines never reached marked.
"""

from __future__ import annotations

import base64
import io
import itertools
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jinja2
import matplotlib

matplotlib.use("Agg")  # no display: render to files only
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import LinearSegmentedColormap  # noqa: E402

from oracle.kernel_coverage import summary as coverage  # noqa: E402
from oracle.verdict import ULP_BINS  # noqa: E402
from oracle.declare.registry import SPECS  # noqa: E402
from oracle.report.results import typical_excess  # noqa: E402

DTYPES = ("float32", "float16", "bfloat16")
TEMPLATES = Path(__file__).parent / "templates"
# Error ratio colours: green at or below HF's own error, amber up to the 2x bound, red beyond it.
RATIO_COLOURS = LinearSegmentedColormap.from_list("ratio", [(0, "#1a9850"), (1 / 3, "#a6d96a"), (0.5, "#fee08b"),
                                                            (2 / 3, "#fc8d59"), (1, "#d73027")])
# a share of a bound on [0, 1.5]: green to yellow while it passes (up to 1), orange to red past it
SHARE_COLOURS = LinearSegmentedColormap.from_list("share", [(0, "#1a9850"), (1 / 3, "#a6d96a"), (0.66, "#fee08b"),
                                                            (0.67, "#fc8d59"), (1, "#d73027")])


def _svg(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(fig)
    return "data:image/svg+xml;base64," + base64.b64encode(buffer.getvalue()).decode()


def _rows(cells: list[dict]) -> list[str]:
    return sorted({f"{c['op']}/{c['variant']} {c['tensor']}" for c in cells})


def _grid(cells: list[dict], value, reduce) -> tuple[list[str], list[list[float]]]:
    rows = _rows(cells)
    by = defaultdict(list)
    for cell in cells:
        if cell["metrics"]:
            by[(f"{cell['op']}/{cell['variant']} {cell['tensor']}", cell["dtype"])].append(value(cell["metrics"]))
    return rows, [[reduce(by[(r, d)]) if by[(r, d)] else math.nan for d in DTYPES] for r in rows]


@dataclass(frozen=True)
class ColourScale:
    """How a heatmap shows its values: colours of ``cmap`` over [low, high] (values clipped there),
    the colour bar's label, and how each cell's number is written."""

    cmap: object  # a colormap or its name
    low: float
    high: float
    label: str
    text: Callable[[float], str]


def _heatmap(rows, grid, title, scale: ColourScale, colours=None) -> str:
    """Colours clipped to the scale's range (of ``colours`` where given, else of the values); the
    numbers written in the cells are the real values."""
    if not rows:  # a run with no cells (a shard of checks alone)
        return "<p>No cells in this run.</p>"
    fig, ax = plt.subplots(figsize=(6.2, 0.32 * len(rows) + 1.4))
    clipped = [[min(max(v, scale.low), scale.high) if not math.isnan(v) else v for v in row]
               for row in (colours or grid)]
    image = ax.imshow(clipped, aspect="auto", cmap=scale.cmap, vmin=scale.low, vmax=scale.high)
    ax.set_xticks(range(len(DTYPES)), DTYPES)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.xaxis.tick_top()
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            if not math.isnan(value):
                ax.text(j, i, scale.text(value), ha="center", va="center", fontsize=7)
    fig.colorbar(image, ax=ax, label=scale.label, shrink=0.8)
    ax.set_title(title, fontsize=10, pad=24)
    return _svg(fig)


def ratio_heatmap(cells) -> str:
    """The worst error ratio written in each cell, coloured by the worst max|k-t| as a share of its
    own bound (2 max|h-t| + floor): a ratio of 2.56 that passes by its floor is green, not red."""
    rows, grid = _grid(cells, lambda m: m["error_ratio"], max)
    _, shares = _grid(cells, lambda m: m["max_abs"] / m["bound"] if m["bound"] > 0 else (0.0 if not m["max_abs"] else 9.9),
                      max)
    scale = ColourScale(SHARE_COLOURS, 0, 1.5, "max|k-t| / bound (above 1 fails)", lambda v: f"{v:.3g}")
    return _heatmap(rows, grid, "worst error ratio max|k-t| / max|h-t| (colour: max|k-t| as a share of its bound)",
                    scale, colours=shares)


def _share_of_bound(value: str, bound: str):
    def share(m: dict) -> float:
        if m.get(value) is None:
            return math.nan
        return m[value] / m[bound] if m[bound] > 0 else (0.0 if m[value] == 0 else math.inf)
    return share


def element_heatmap(cells) -> str:
    rows, grid = _grid(cells, _share_of_bound("element_max", "element_bound"), _nanmax)
    scale = ColourScale(RATIO_COLOURS, 0, 1.5, "share of the per-element bound (above 100% fails)",
                        lambda v: f"{v:.0%}")
    return _heatmap(rows, grid, "worst element error / its bound over the grid (colour clipped at 1.5)", scale)


def typical_heatmap(cells) -> str:
    def excess(m: dict) -> float:
        return typical_excess(m) if m.get("mean_error") is not None else math.nan

    rows, grid = _grid(cells, excess, _nanmax)
    scale = ColourScale(RATIO_COLOURS, 0, 1.5, "share of the allowance used (above 100% fails)", lambda v: f"{v:.0%}")
    return _heatmap(rows, grid, "typical (mean) error above HF's, as a share of the allowance (colour clipped at 1.5)",
                    scale)


def _nanmax(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return max(finite) if finite else math.nan


def bit_identity_heatmap(cells) -> str:
    rows, grid = _grid(cells, lambda m: m["bit_identical"], lambda xs: sum(xs) / len(xs))
    scale = ColourScale("viridis", 0, 1, "fraction bit-identical", lambda v: f"{v:.0%}")
    return _heatmap(rows, grid, "elements bit-identical to HF (mean over the grid)", scale)


def ulp_histograms(cells) -> str:
    ops = sorted({c["op"] for c in cells})
    if not ops:
        return "<p>No cells in this run.</p>"
    fig, axes = plt.subplots(1, len(ops), figsize=(3.2 * len(ops), 2.8), squeeze=False, sharey=True)
    for ax, op in zip(axes[0], ops):
        width = 0.27
        for k, dtype in enumerate(DTYPES):
            counts = [0] * len(ULP_BINS)
            for cell in cells:
                if cell["op"] == op and cell["dtype"] == dtype and cell["metrics"]:
                    for i, name in enumerate(ULP_BINS):
                        counts[i] += cell["metrics"]["ulp_histogram"][name]
            ax.bar([i + (k - 1) * width for i in range(len(ULP_BINS))], [max(c, 0.5) for c in counts], width,
                   label=dtype)
        ax.set_yscale("log")
        ax.set_xticks(range(len(ULP_BINS)), ULP_BINS, rotation=45, fontsize=7)
        ax.set_title(op, fontsize=9)
        ax.set_xlabel("ULPs from HF", fontsize=8)
    axes[0][0].set_ylabel("elements")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("distance to HF's result in its own dtype, all tensors of the grid", fontsize=10, y=1.06)
    return _svg(fig)


def error_vs_columns(cells) -> str:
    """Worst error per column count (over the grid's cases with that many columns, contiguous)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
    # every op whose cases take the case's layout, by its first output (the raw kernels repeat their op's)
    charted = [(spec.name, spec.outputs[0]) for spec in SPECS.values() if spec.layout_args]
    for (op, tensor), marker in zip(charted, itertools.cycle("os^vD<>")):
        for dtype in DTYPES:
            worst: dict[int, tuple[float, float]] = {}
            for c in cells:
                m = c["metrics"]
                if c["op"] == op and c["tensor"] == tensor and c["dtype"] == dtype and m and c["columns"] \
                        and c["layout"] == "contiguous":
                    ratio, scaled = worst.get(c["columns"], (0.0, 0.0))
                    worst[c["columns"]] = (max(ratio, m["error_ratio"]),
                                           max(scaled, m["max_abs"] / m["truth_max_abs"] if m.get("truth_max_abs") else 0.0))
            if not worst:
                continue
            xs = sorted(worst)
            axes[0].plot(xs, [worst[x][0] for x in xs], marker=marker, label=f"{op} {tensor} {dtype}", linewidth=1,
                         markersize=4)
            axes[1].plot(xs, [max(worst[x][1], 1e-12) for x in xs], marker=marker, linewidth=1, markersize=4)
    for ax, label in ((axes[0], "worst error ratio to HF"), (axes[1], "worst max|k-t| / max|t|")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("columns (last dimension)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    if axes[0].get_legend_handles_labels()[0]:  # a shard of the grid may hold no contiguous cell
        axes[0].legend(fontsize=6, ncol=2)
    fig.suptitle("error against column count (contiguous layout)", fontsize=10, y=1.02)
    return _svg(fig)


# The performance figure's rows: a timing field per phase, and what its ratio to compile's means.
_RATIO_ROWS = (("gpu", "GPU time / compile's\n(CUDA-graph replay, log)"),
               ("loop", "wall per call / compile's\n(eager loop, host included, log)"))


def _ratio_bars(ax, timings: list[dict], keys: list[tuple], impls: list[str], field: str) -> None:
    """One bar per implementation and workload: its ``field`` over compile's in the same run."""
    width = 0.8 / max(1, len(impls))
    rows = {key: {} for key in keys}  # workload -> implementation -> its timing
    for t in timings:
        rows.setdefault((t["op"], t["variant"], t["dtype"]), {})[t["impl"]] = t
    for k, impl in enumerate(impls):
        values = []
        for key in keys:
            base, mine = rows[key].get("compile", {}).get(field), rows[key].get(impl, {}).get(field)
            values.append(mine / base if mine and base else 0)
        ax.bar([i + (k - (len(impls) - 1) / 2) * width for i in range(len(keys))], values, width, label=impl)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")  # eager is 10x slower; the differences that matter are near 1
    ax.set_xticks(range(len(keys)), [f"{o}\n{v}\n{d}" for o, v, d in keys], fontsize=6)


def perf_figures(bench: dict) -> dict[str, str]:
    """The benchmark's pictures: each implementation's GPU time and wall per call (the eager loop's,
    host time included) over torch.compile's, forward and forward+backward; RMSNorm's bandwidth
    across widths when the run swept them."""
    figures = {}
    timings = bench.get("timings", [])
    keys = sorted({(t["op"], t["variant"], t["dtype"]) for t in timings})
    impls = [i for i in ("kernels", "compile", "liger", "eager") if any(t["impl"] == i for t in timings)]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), squeeze=False)
    for row, (measure, label) in zip(axes, _RATIO_ROWS):
        for ax, phase, title in ((row[0], "fwd", "forward"), (row[1], "fwd_bwd", "forward + backward")):
            _ratio_bars(ax, timings, keys, impls, f"{phase}_{measure}_ms")
            ax.set_ylabel(label, fontsize=8)
            ax.set_title(title, fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("time relative to torch.compile, same run", fontsize=10)
    fig.tight_layout()
    figures["ratios"] = _svg(fig)
    sweep = bench.get("column_sweep", [])
    if sweep:
        fig, ax = plt.subplots(figsize=(7, 3.4))
        for impl in impls:
            points = sorted(((int(t["variant"].split(", ")[1].split()[0]), t) for t in sweep
                             if t["impl"] == impl and t.get("fwd_gpu_ms")), key=lambda p: p[0])
            if points:
                ax.plot([p[0] for p in points], [p[1]["fwd_bytes"] / (p[1]["fwd_gpu_ms"] * 1e-3) / 1e12 for p in points],
                        marker="o", label=impl)
        ax.axhline(bench["copy_tbps"], color="grey", linestyle="--", label="copy")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("columns")
        ax.set_ylabel("RMSNorm forward TB/s")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        figures["sweep"] = _svg(fig)
    return figures


def kernel_coverage_view(document: dict) -> list[dict]:
    """The dashboard's kernel coverage: per op (launches outside cases last), each kernel with its
    counts, the values its constexprs launched with, the configs judged, the blocks never reached
    and its source marked line by line; [] for a run without it."""
    recorded = document.get("kernel_coverage") or {}
    view = []
    for scope in coverage.ordered_scopes(recorded):
        kernels = []
        for key, record in sorted(recorded[scope].items()):
            kernels.append({"name": record["name"], "file": record["file"], "first_line": record["first_line"],
                            "counts": coverage.kernel_counts(record), "traced": record["traced"],
                            "constexprs": coverage.constexpr_line(record["specialisations"], width=10**6),
                            "configs": sorted(record["configs"].items()), "configs_total": record["configs_total"],
                            "unreached": coverage.unreached_blocks(record), "source": record.get("source") or []})
        view.append({"scope": scope, "kernels": kernels})
    return view


def render(document: dict, comparison: dict | None = None, bench: dict | None = None, updated: bool = False) -> str:
    """``updated``: this run is stored as the baseline it was compared with, which the headline says."""
    from oracle.report.terminal import maths_line

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=jinja2.select_autoescape(["j2"]),
                             undefined=jinja2.StrictUndefined)
    cells = document["cells"]
    figures = {"ratio": ratio_heatmap(cells), "bit_identity": bit_identity_heatmap(cells),
               "element": element_heatmap(cells), "typical": typical_heatmap(cells),
               "ulps": ulp_histograms(cells), "columns": error_vs_columns(cells)}
    perf = perf_figures(bench) if bench else {}
    regression_keys = {d["key"] for d in comparison["deltas"] if d["regression"]} if comparison else set()
    return env.get_template("dashboard.html.j2").render(
        doc=document, figures=figures, perf=perf, bench=bench, comparison=comparison, maths=maths_line(document),
        kernel_coverage=kernel_coverage_view(document),
        updated=updated,
        regression_keys=regression_keys, passed=sum(c["status"] == "pass" for c in document["cases"]),
        findings=sum(len(a["findings"]) for a in document["aliasing"]) + sum(len(c["findings"]) for c in document["cases"]),
    )
