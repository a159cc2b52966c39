"""How close two implementations' verdicts come to the line, cell by cell, from two report runs.

    python scripts/verdict_margin.py OLD.json NEW.json [--tensor dW] [--only-differing]

For each cell of the tensor that both runs judged (same op, variant, dtype, case and tensor), the
typical error over its bound (``mean_error / mean_bound``: above 1 fails), the error spread over its
bound (``spread / spread_bound``, where the spread judgement applies: compare.py, Note [The spread
judgement]), the share of elements more than 1 ULP off beside HF's, and the verdict. A cell's margin
is the larger of its two ratios. A cell "differs" where the two implementations'
results are not the same numbers (their typical errors or bit-identity to HF differ); the last lines
say, over the differing cells, how many each run fails, and the closest either comes to the line:
the smallest margin of a failing cell and the largest of a passing one. Made for Liger-Kernel 0.6.4
against 0.8.5 at scale (issue 35: the bf16 dW partial sums of Liger #950), on any two runs.
"""

from __future__ import annotations

import argparse
import json
import sys


def cells_of(path: str, tensor: str) -> dict[str, dict]:
    document = json.loads(open(path).read())
    return {f"{c['op']}/{c['variant']}/{c['dtype']}/{c['label']}": c for c in document["cells"] if c["tensor"] == tensor}


def typical(cell: dict) -> float:
    metrics = cell["metrics"]
    return metrics["mean_error"] / metrics["mean_bound"] if metrics["mean_bound"] else float("inf")


def spread(cell: dict) -> float | None:
    """None where the run did not judge the spread (a report of an earlier commit, or not a sum)."""
    metrics = cell["metrics"]
    return metrics["spread"] / metrics["spread_bound"] if metrics.get("spread_bound") else None


def margin(cell: dict) -> float:
    return max(typical(cell), spread(cell) or 0.0)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def same_numbers(a: dict, b: dict) -> bool:
    keys = ("mean_error", "bit_identical", "max_abs")
    return all(a["metrics"].get(k) == b["metrics"].get(k) for k in keys)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--tensor", default="dW")
    parser.add_argument("--only-differing", action="store_true")
    args = parser.parse_args(argv)
    old, new = cells_of(args.old, args.tensor), cells_of(args.new, args.tensor)
    common = [key for key in old if key in new]
    if not common:
        print(f"no {args.tensor} cell judged in both runs", file=sys.stderr)
        return 2
    print(f"{'cell':<62} {'old typical':>11} {'new typical':>11} {'old spread':>10} {'new spread':>10} "
          f"{'old >1ulp':>9} {'new >1ulp':>9} {'HF >1ulp':>8}  verdicts")
    differing = []
    for key in common:
        a, b = old[key], new[key]
        differs = not same_numbers(a, b)
        if differs:
            differing.append(key)
        elif args.only_differing:
            continue
        print(f"{key:<62} {typical(a):>11.3f} {typical(b):>11.3f} {_ratio(spread(a)):>10} {_ratio(spread(b)):>10} "
              f"{a['metrics']['over_1ulp']:>9.1%} "
              f"{b['metrics']['over_1ulp']:>9.1%} {a['metrics']['hf_over_1ulp']:>8.1%}  "
              f"{a['status']}/{b['status']}{'' if differs else '  (same numbers)'}")
    for name, run in (("old", old), ("new", new)):
        failing = [margin(run[k]) for k in differing if run[k]["status"] != "pass"]
        passing = [margin(run[k]) for k in differing if run[k]["status"] == "pass"]
        print(f"{name}: {len(failing)} of {len(differing)} differing cells fail"
              + (f"; smallest failing margin {min(failing):.3f}" if failing else "")
              + (f"; largest passing margin {max(passing):.3f}" if passing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
