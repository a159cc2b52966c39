"""The derived noise model against the hand-written ones, on the built-in ops (issue: "proof that
the automatic model is a real verdict"):

- per op, compared tensor and dtype, the ratio of the per-element scales the verdict divides by,
  derived / hand-written (ulp(t) + noise each; median and the 5th and 95th percentiles over the
  elements of the report's quick grid and the stratified cases): below 1 the derived model is the
  tighter one;
- the cost: seconds to prepare a case (HF, the truth, the reordered form, the noise) with each model,
  summed over the same cases, and their ratio.

    python scripts/derived_noise_tables.py --json reports/derived-noise-cpu.json   # CPU
    python scripts/derived_noise_tables.py --device cuda --json reports/derived-noise-h200.json

Prints two markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from oracle import engine  # noqa: E402
from oracle.cases import CPU_BUDGET, FLOAT_DTYPES  # noqa: E402
from oracle.noise import rounding  # noqa: E402
from oracle.declare.registry import SPECS  # noqa: E402
from oracle.declare.spec import DTYPES  # noqa: E402


def _cases(spec, dtype: str) -> list:
    return [c for c in spec.sweep(False) if c.dtype == dtype] + spec.stratified(dtype, CPU_BUDGET)


def _prepared(spec, case, device, model: str):
    os.environ["ORACLE_NOISE_MODEL"] = model
    start = time.perf_counter()
    prepared = engine.prepare(spec, case, device)
    return prepared, time.perf_counter() - start


def measure(device) -> dict:
    ratios, costs = {}, {}
    for name, spec in SPECS.items():
        if not spec.noise:  # a declared op has no hand-written model to compare with
            continue
        seconds = {"declared": 0.0, "derived": 0.0}
        for dtype in FLOAT_DTYPES:
            collected = {tensor: [] for tensor in spec.compared()}
            for case in _cases(spec, dtype):
                hand, t_hand = _prepared(spec, case, device, "declared")
                auto, t_auto = _prepared(spec, case, device, "derived")
                seconds["declared"] += t_hand
                seconds["derived"] += t_auto
                for tensor in spec.compared():
                    t = hand.truth.tensors()[tensor].double()
                    ulp = rounding.spacing(t, DTYPES[dtype])
                    mine = ulp + auto.element_noise[tensor].expand(t.shape)
                    theirs = ulp + hand.element_noise[tensor].to(t.device).expand(t.shape)
                    keep = torch.isfinite(t) & torch.isfinite(mine) & torch.isfinite(theirs)
                    collected[tensor].append((mine[keep] / theirs[keep]).flatten().cpu())
            for tensor, parts in collected.items():
                values = torch.cat(parts)
                if values.numel():
                    q = torch.quantile(values[: 2**24], torch.tensor([0.05, 0.5, 0.95], dtype=values.dtype))
                    ratios[f"{name}/{tensor}/{dtype}"] = [float(v) for v in q]
        costs[name] = seconds
    os.environ.pop("ORACLE_NOISE_MODEL", None)
    return {"device": str(device), "ratios": ratios, "seconds": costs}


def markdown(result: dict) -> str:
    lines = ["| op / tensor | float32 | float16 | bfloat16 |", "|---|---|---|---|"]
    keys = sorted({k.rsplit("/", 1)[0] for k in result["ratios"]}, key=lambda k: (list(SPECS).index(k.split("/")[0]), k))
    for key in keys:
        cells = []
        for dtype in FLOAT_DTYPES:
            q = result["ratios"].get(f"{key}/{dtype}")
            cells.append(f"{q[1]:.2f} ({q[0]:.2f}-{q[2]:.2f})" if q else "-")
        lines.append(f"| {key.replace('/', ' ')} | " + " | ".join(cells) + " |")
    lines += ["", "| op | declared model (s) | derived model (s) | ratio |", "|---|---:|---:|---:|"]
    for name, s in result["seconds"].items():
        lines.append(f"| {name} | {s['declared']:.1f} | {s['derived']:.1f} | {s['derived'] / max(s['declared'], 1e-9):.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result = measure(torch.device(args.device))
    print(markdown(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
