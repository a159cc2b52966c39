"""Markdown tables from ``python -m oracle.mutate --json`` files, for docs/findings.md and
docs/reference/verdict.md: the score per op file, and what each check killed, by operator.

    python scripts/mutation_tables.py reports/mutate-kernels-h200.json [more.json ...]
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path


def score_rows(data: dict) -> list[str]:
    by_file: dict[str, Counter] = {}
    for m in data["mutants"]:
        by_file.setdefault(Path(m["file"]).name, Counter())[m["class"]] += 1
    rows = []
    for name, counts in sorted(by_file.items()):
        counted = sum(counts.values()) - counts["equivalent"] - counts["not run"]
        score = f"{counts['killed'] / counted:.0%}" if counted else "n/a"
        rows.append(f"| {data['impl']} | {name} | {sum(counts.values())} | {counts['killed']} | {counts['equivalent']} | "
                    f"{counts['not reached']} | {counts['undetected']} | {counts['not run']} | {score} |")
    return rows


def catches_rows(datas: list[dict]) -> list[str]:
    table: dict[str, Counter] = {}
    for data in datas:
        for check, operators in data.get("catches", {}).items():
            table.setdefault(check, Counter()).update(operators)
    return [f"| `{check}` | " + ", ".join(f"{op} {n}" for op, n in counts.most_common()) + " |"
            for check, counts in sorted(table.items(), key=lambda kv: -sum(kv[1].values()))]


def main(paths: list[str]) -> None:
    datas = [json.loads(Path(p).read_text()) for p in paths]
    print("| implementation | file | mutants | killed | equivalent | not reached | undetected | not run | score |")
    print("|---|---|---|---|---|---|---|---|---|")
    for data in datas:
        print("\n".join(score_rows(data)))
    print()
    print("| check | mutants it killed, by operator |")
    print("|---|---|")
    print("\n".join(catches_rows(datas)))


if __name__ == "__main__":
    main(sys.argv[1:])
