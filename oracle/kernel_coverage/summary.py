"""Kernel coverage as a reader wants it: merged over processes, one short block per op, and the
lines never reached with the conditions they sit under."""

from __future__ import annotations

from oracle.kernel_coverage.source import conditions_over


def merge(into: dict, other: dict) -> dict:
    """Add one process's ``Recorder.to_json()`` to another's (pytest's workers, the report's)."""
    for scope, kernels in other.items():
        mine = into.setdefault(scope, {})
        for key, record in kernels.items():
            if key not in mine:
                mine[key] = {**record, "hits": list(record["hits"]), "specialisations": dict(record["specialisations"]),
                             "configs": dict(record["configs"])}
                continue
            kept = mine[key]
            kept["hits"] = sorted(set(kept["hits"]) | set(record["hits"]))
            for name in ("specialisations", "configs"):
                for value, count in record[name].items():
                    kept[name][value] = kept[name].get(value, 0) + count
            kept["configs_total"] = kept["configs_total"] or record["configs_total"]
            kept["launched"] = kept["launched"] or record["launched"]
            kept["traced"] = kept["traced"] or record["traced"]
    return into


def unreached(record: dict) -> list[int]:
    """The statements of a traced kernel that never ran."""
    return sorted(set(record["statements"]) - set(record["hits"])) if record["traced"] else []


def ranges(lines: list[int]) -> list[tuple[int, int]]:
    """Consecutive line numbers joined: [3, 4, 5, 9] -> [(3, 5), (9, 9)]."""
    spans: list[tuple[int, int]] = []
    for line in lines:
        if spans and line == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], line)
        else:
            spans.append((line, line))
    return spans


def reached_under(record: dict, line: int) -> list[str]:
    """The tests of the branches enclosing a line of a recorded kernel, outermost first."""
    return conditions_over(record["file"], record["first_line"], line)


def kernel_line(key: str, record: dict) -> str:
    """One kernel's coverage in a line: lines, specialisations, configs."""
    parts = [f"{key.rsplit(':', 1)[0]}"]
    if record["traced"]:
        parts.append(f"lines {len(record['hits'])}/{len(record['statements'])}")
    else:
        parts.append("lines not traced")
    if record["launched"]:
        parts.append(f"{len(record['specialisations'])} specialisation(s)")
    else:
        parts.append("called from kernels")
    if record["configs_total"]:
        parts.append(f"configs judged {len(record['configs'])}/{record['configs_total']}")
    return ": ".join(parts[:1]) + ": " + ", ".join(parts[1:])


def op_lines(scope: str, kernels: dict, detail: int = 4) -> list[str]:
    """The summary block of one op: each kernel, its specialisations, its lines never reached."""
    lines = [f"kernel coverage {scope}:"]
    for key, record in sorted(kernels.items()):
        lines.append("  " + kernel_line(key, record))
        specialisations = sorted(record["specialisations"])
        for text in specialisations[:detail]:
            lines.append(f"    seen: {text}")
        if len(specialisations) > detail:
            lines.append(f"    ... and {len(specialisations) - detail} more specialisation(s)")
        for first, last in ranges(unreached(record)):
            where = " and ".join(f"`{c}`" for c in reached_under(record, first)) or "straight-line code"
            span = f"{first}" if first == last else f"{first}-{last}"
            lines.append(f"    never reached: line {span} (under {where})")
    return lines


def summary_lines(coverage: dict) -> list[str]:
    """Every scope's block, ops first, launches outside cases last."""
    from oracle.kernel_coverage.collect import OUTSIDE

    scopes = sorted(s for s in coverage if s != OUTSIDE) + ([OUTSIDE] if OUTSIDE in coverage else [])
    return [line for scope in scopes if coverage[scope] for line in op_lines(scope, coverage[scope])]
