"""Kernel coverage as a reader wants it: merged over processes, one short block per op, the lines
never reached with the conditions they sit under, and (for the report) each kernel's source marked."""

from __future__ import annotations

import re

from oracle.kernel_coverage.source import conditions_over, display_path, function_lines

HIT, UNREACHED = "hit", "unreached"  # a source line's mark; "" for a line that is no statement, or not traced


def merge(into: dict, other: dict) -> dict:
    """Add one process's ``Recorder.to_json()`` to another's (pytest's workers, the report's)."""
    for scope, kernels in other.items():
        mine = into.setdefault(scope, {})
        for key, record in kernels.items():
            if key not in mine:
                mine[key] = {**record, "hits": list(record["hits"]), "specialisations": dict(record["specialisations"]),
                             "configs": dict(record["configs"]), "configs_listed": list(record.get("configs_listed", []))}
                continue
            kept = mine[key]
            kept["hits"] = sorted(set(kept["hits"]) | set(record["hits"]))
            for name in ("specialisations", "configs"):
                for value, count in record[name].items():
                    kept[name][value] = kept[name].get(value, 0) + count
            kept["configs_listed"] = sorted(set(kept["configs_listed"]) | set(record.get("configs_listed", [])))
            kept["configs_total"] = len(kept["configs_listed"]) or kept["configs_total"] or record["configs_total"]
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
    """The conditions of the branches enclosing a line of a recorded kernel, outermost first: as a
    report stored them (its ``unreached``), else read from the kernel's file."""
    for stored in record.get("unreached") or ():
        if stored["line"] == line:
            return list(stored["under"])
    return conditions_over(record["file"], record["first_line"], line)


def unreached_blocks(record: dict) -> list[tuple[int, int, list[str]]]:
    """(first line, last line, conditions) of each run of statements never reached: statements that
    follow one another with no statement run between them and sit under the same conditions."""
    order = {line: i for i, line in enumerate(sorted(record["statements"]))}
    blocks: list[tuple[int, int, list[str]]] = []
    for line in unreached(record):
        under = reached_under(record, line)
        if blocks and blocks[-1][2] == under and order[line] == order[blocks[-1][1]] + 1:
            blocks[-1] = (blocks[-1][0], line, under)
        else:
            blocks.append((line, line, under))
    return blocks


def kernel_line(key: str, record: dict) -> str:
    """One kernel's coverage in a line: where it is, then its counts."""
    return f"{key.rsplit(':', 1)[0]}: {kernel_counts(record)}"


def kernel_counts(record: dict) -> str:
    """Lines run out of the statements, specialisations launched, configs judged out of the configs."""
    parts = []
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
    return ", ".join(parts)


_NEXT_NAME = re.compile(r", (?=\w+=)")  # between two NAME=value of a specialisation (collect.specialisation)


def constexpr_values(specialisations) -> dict[str, list[str]]:
    """Each constexpr's values over a kernel's specialisations, in the order first seen:
    ['A=1, B=x', 'A=2, B=x'] -> {'A': ['1', '2'], 'B': ['x']}."""
    values: dict[str, list[str]] = {}
    for text in specialisations:
        for part in _NEXT_NAME.split(text):
            name, equals, value = part.partition("=")
            if equals and value not in values.setdefault(name, []):
                values[name].append(value)
    return values


def constexpr_line(specialisations, width: int = 160) -> str | None:
    """'A=1|2, B=x': every constexpr with the values it launched with, a constexpr seen with only
    one value showing as plainly as one that never varies; None without constexprs."""
    values = constexpr_values(sorted(specialisations))
    if not values:
        return None
    text = ", ".join(f"{name}={'|'.join(sorted(seen, key=_value_order))}" for name, seen in values.items())
    return text if len(text) <= width else text[:width - 3] + "..."


def _value_order(value: str) -> tuple:
    """Numbers by their value (BLOCK_SIZE=8|256|8192), anything else by its text after them."""
    try:
        return 0, float(value), ""
    except ValueError:
        return 1, 0.0, value


def op_lines(scope: str, kernels: dict) -> list[str]:
    """The summary block of one op: each kernel with its counts, its constexprs' values, its lines
    never reached with what would reach them, and the configs judged where not all were."""
    lines = [f"kernel coverage {scope}:"]
    for key, record in sorted(kernels.items()):
        lines.append("  " + kernel_line(key, record))
        constexprs = constexpr_line(record["specialisations"]) if record["launched"] else None
        if constexprs:
            lines.append(f"    constexprs seen: {constexprs}")
        for first, last, under in unreached_blocks(record):
            where = " and ".join(f"`{c}`" for c in under) or "straight-line code"
            span = f"line {first}" if first == last else f"lines {first}-{last}"
            lines.append(f"    never reached: {span} (under {where})")
    return lines


def ordered_scopes(coverage: dict) -> list[str]:
    """The scopes that recorded a kernel: ops by name, launches outside cases last."""
    from oracle.kernel_coverage.collect import OUTSIDE

    scopes = sorted(s for s in coverage if s != OUTSIDE) + ([OUTSIDE] if OUTSIDE in coverage else [])
    return [scope for scope in scopes if coverage[scope]]


def summary_lines(coverage: dict) -> list[str]:
    """Every scope's block, ops first, launches outside cases last."""
    return [line for scope in ordered_scopes(coverage) for line in op_lines(scope, coverage[scope])]


# --- the report's form --------------------------------------------------------------------------


def marked_source(record: dict) -> list[list]:
    """[line number, mark, text] for each line of the kernel: ``hit``, ``unreached`` or "" (no
    statement, or not traced: compiled on a GPU). The text is the record's stored source where it
    has one (a report merged from shards), else the kernel's file as it is now; [] without either."""
    stored = {number: text for number, _, text in record.get("source") or ()}
    texts = list(stored.items()) if stored else \
        list(enumerate(function_lines(record["file"], record["first_line"]), start=record["first_line"]))
    hits, missed = set(record["hits"]) if record["traced"] else set(), set(unreached(record))
    return [[number, HIT if number in hits else UNREACHED if number in missed else "", text] for number, text in texts]


def for_report(coverage: dict) -> dict:
    """Merged coverage as the report's JSON holds it: per op and kernel the record with its file
    shown relative to the working directory, each unreached statement with the conditions over it,
    and its source lines marked. Applied again to a merge of such documents, it marks them afresh."""
    out: dict = {}
    for scope, kernels in coverage.items():
        out[scope] = {}
        for key, record in kernels.items():
            shown = {**record, "unreached": [{"line": line, "under": reached_under(record, line)}
                                             for line in unreached(record)], "source": marked_source(record)}
            out[scope][key] = {**shown, "file": display_path(record["file"])}
    return out
