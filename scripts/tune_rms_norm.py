"""Measure RMSNorm's launch settings on a GPU and keep the best per width (kernels/_rms_norm_configs.py).

    python scripts/tune_rms_norm.py --pass forward --out fwd.json      # on the GPU, one pass per GPU
    python scripts/tune_rms_norm.py --pass backward --out bwd.json
    python scripts/tune_rms_norm.py --merge fwd.json bwd.json          # into kernels/rms_norm_configs.json
    python scripts/tune_rms_norm.py --pass backward --variant gemma --widths 16384 --out gemma.json

Every power-of-two width from 128 to 65536 at 2^26 elements (128 MiB in bf16; Llama, or --variant), each
candidate timed with triton.testing.do_bench (median, L2 flushed between calls) and its peak memory
read; the fastest is kept, or within MEMORY_TIE of it the one holding the least memory. The results
are written after each width, so a run cut short still leaves what it measured.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels._rms_norm_configs import CONFIG_FILE, SCHEMA, Config
from kernels.rms_norm import _stages

WIDTHS = [2**k for k in range(7, 17)]
ELEMENTS = 2**26
MEMORY_TIE = 0.05  # a setting this much slower than the fastest is chosen where it holds less memory


def _warps_for(elements: int, choices=(2, 4, 8, 16, 32)) -> list[int]:
    """Warp counts giving each thread 4 to 64 elements of a block."""
    return [w for w in choices if 4 <= elements // (32 * w) <= 64]


def _parts_resident(chunk: int, warps: int) -> int:
    """Programs of the parts forward one SM holds at once, by its 64 Ki registers: about twice a thread's
    share of the columns plus 30 (``scripts/rms_norm_registers.py --pass parts`` with Triton 3.6: 98
    registers at 8192 columns and 8 warps, 47 at 4096 and 8, 99 at 16384 and 16)."""
    registers = min(255, 2 * chunk // (32 * warps) + 30)
    return 65536 // (registers * 32 * warps)


def forward_candidates(width: int) -> list[Config]:
    out = []
    for tile in (1024, 2048, 4096, 8192, 16384, 65536):
        rows = tile // width
        if rows < 1 or rows > 128 or (rows == 1 and tile != width):
            continue
        out += [Config("rows", warps, rows=rows) for warps in _warps_for(tile)]
    if width >= 8192:
        for rows, chunk, per_sm, stages in itertools.product((1, 2, 4), (4096, 8192, 16384), (1, 2, 4), (1, 2, 3)):
            if chunk < width and rows * chunk <= 16384:
                out += [Config("looped", warps, rows=rows, chunk=chunk, programs_per_sm=per_sm, stages=stages)
                        for warps in _warps_for(rows * chunk, (8, 16, 32))]
        # two rows' sweeps in one loop (Note [Two rows a step]): one row a program, at least two chunks a row
        for chunk, per_sm in itertools.product((4096, 8192, 16384, 32768), (1, 2)):
            if chunk < width:
                out += [Config("overlapped", warps, chunk=chunk, programs_per_sm=per_sm)
                        for warps in _warps_for(chunk, (8, 16, 32))]
        # programs sharing a row (Note [A row shared by programs]): 2 to 16 of them, only as many per SM
        # as its registers hold at once (a program not resident leaves its partners polling until their
        # patience ends: right, and slow)
        for chunk, per_sm in itertools.product((4096, 8192, 16384, 32768), (1, 2, 4, 8)):
            if 2 <= width // chunk <= 16:
                out += [Config("parts", warps, chunk=chunk, programs_per_sm=per_sm)
                        for warps in _warps_for(chunk, (4, 8, 16, 32)) if per_sm <= _parts_resident(chunk, warps)]
    return out


def backward_candidates(width: int) -> list[Config]:
    out = []
    for tile, per_sm in itertools.product((2048, 4096, 8192, 16384, 32768, 65536), (1, 2, 4)):
        rows = tile // width
        if 1 <= rows <= 64 and not (rows == 1 and tile != width):
            # pipelined as far as the tiles fit (x and dY in bf16: 4 bytes a column), and not at all
            # (its shared memory is L1's: _stages)
            out += [Config("rows", warps, rows=rows, programs_per_sm=per_sm, stages=stages)
                    for warps in _warps_for(tile, (4, 8, 16, 32)) for stages in sorted({_stages(tile * 4), 1})]
    if width >= 2048:
        # narrow chunks only for the widest rows: there a chunk per SM and more leaves one row range, whose
        # program stores dW itself (no partial rows, Note [The row sums at dX's end] in kernels/rms_norm.py)
        chunks = (1024, 2048, 4096) + ((128, 256, 512) if width >= 32768 else ())
        for chunk, tile, per_sm in itertools.product(chunks, (4096, 8192, 16384), (1, 2, 4)):
            if chunk < width and tile >= chunk:
                out += [Config("split", warps, rows=tile // chunk, chunk=chunk, programs_per_sm=per_sm,
                               stages=_stages(tile * 4))
                        for warps in _warps_for(tile, (4, 8))]
    return out


def _time_width(rms, pass_name: str, width: int, gemma: bool) -> list[dict]:
    import torch
    import triton.testing

    from oracle.bench import peak_mb

    X = torch.randn(ELEMENTS // width, width, device="cuda", dtype=torch.bfloat16)
    W = (1 + 0.1 * torch.randn(width, device="cuda")).to(torch.bfloat16)
    dY = torch.randn_like(X)
    _, inv_var = rms.forward(X, W, 1e-6, gemma)
    dX = torch.empty_like(X)
    timed = []
    for config in forward_candidates(width) if pass_name == "forward" else backward_candidates(width):
        if pass_name == "forward":
            def call(config=config):
                return rms.forward(X, W, 1e-6, gemma, config)
        else:
            def call(config=config):
                return rms.backward(dY, X, W, inv_var, gemma, dX, True, config)
        try:
            kib = peak_mb(call) * 1024  # beyond the inputs and dX, allocated before the call
            timed.append({"config": vars(config), "kib": kib,
                          "ms": float(triton.testing.do_bench(call, warmup=10, rep=40, return_mode="median"))})
        except Exception as exc:  # noqa: BLE001 - a setting that cannot run is recorded, not fatal
            timed.append({"config": vars(config), "error": f"{type(exc).__name__}: {str(exc)[:160]}"})
    return timed


def choose(timed: list[dict]) -> dict:
    """The setting holding the least memory among those within MEMORY_TIE of the fastest (the faster of
    equals): the benchmark wants peak memory no higher than torch.compile's as well as speed."""
    ran = [t for t in timed if "ms" in t]
    fastest = min(t["ms"] for t in ran)
    return min((t for t in ran if t["ms"] <= fastest * (1 + MEMORY_TIE)), key=lambda t: (t.get("kib", 0.0), t["ms"]))


def measure(pass_name: str, widths: list[int], out_path: Path, variant: str = "llama") -> None:
    import torch

    from oracle.environment import environment

    rms = importlib.import_module("kernels.rms_norm")
    result = {"pass": pass_name, "variant": variant, "environment": environment(), "elements": ELEMENTS,
              "dtype": "bfloat16", "command": " ".join(["python", *sys.argv]), "widths": {}}
    started = time.perf_counter()
    for width in widths:
        timed = _time_width(rms, pass_name, width, variant == "gemma")
        torch.cuda.empty_cache()
        best = choose(timed)
        result["widths"][str(width)] = {"chosen": best["config"], "ms": best["ms"], "candidates": timed}
        gb = (2 if pass_name == "forward" else 3) * ELEMENTS * 2 / 1e9
        print(f"[{time.perf_counter() - started:5.0f} s] {variant} {pass_name} {width:6d} cols: {len(timed)} settings, "
              f"chosen {best['ms']:.4f} ms ({gb / best['ms']:.2f} TB/s, {best['kib']:.0f} KiB) {best['config']}",
              flush=True)
        out_path.write_text(json.dumps(result, indent=1))


def merge(paths: list[Path], target: Path = CONFIG_FILE) -> None:
    """Per-pass files measured on the GPU, into the table the kernels read (added to the committed
    one when there is one); for a width measured twice, the later file's measurement wins. A Gemma
    measurement goes to the table's "gemma" section, which overrides Llama's entry at its widths."""
    table = json.loads(target.read_text()) if target.exists() else {"schema": SCHEMA}
    if table.get("schema") != SCHEMA:
        raise SystemExit(f"{target}: schema {table.get('schema')!r}, expected {SCHEMA!r}")
    for path in paths:
        data = json.loads(path.read_text())
        variant = data.get("variant", "llama")
        section = table if variant == "llama" else table.setdefault(variant, {})
        section.setdefault(data["pass"], {}).update(data["widths"])
        runs = table.setdefault("measured", {}).setdefault(data["pass"], [])
        runs.append({k: data[k] for k in ("environment", "elements", "dtype", "command")}
                    | {"variant": variant, "widths": list(data["widths"])})
    missing = {"forward", "backward"} - table.keys()
    if missing:
        raise SystemExit(f"no measurements for {sorted(missing)}")
    target.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pass", dest="pass_name", choices=("forward", "backward"))
    parser.add_argument("--widths", type=lambda s: [int(w) for w in s.split(",")], default=WIDTHS)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--variant", choices=("llama", "gemma"), default="llama",
                        help="RMSNorm's variant to measure (Gemma's entries override Llama's where measured)")
    parser.add_argument("--merge", nargs="+", type=Path, help="per-pass results to merge into the kernels' table")
    args = parser.parse_args()
    if args.merge:
        merge(args.merge)
    elif args.pass_name and args.out:
        measure(args.pass_name, args.widths, args.out, args.variant)
    else:
        parser.error("give --pass and --out (on a GPU), or --merge")


if __name__ == "__main__":
    main()
