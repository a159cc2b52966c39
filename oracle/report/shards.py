"""Sweeps split over machines: ``--shard K/N`` runs a deterministic 1/N of a sweep's cases and
checks, and ``--merge a.json b.json ...`` joins the shards' documents into the one run they make up.

Note [Shards]
    A task belongs to shard ``hash(its data identity) mod N``: the case it runs (results.data_identity)
    and, for an aliasing check, the check's name. That depends on nothing but the task itself, so the
    same task lands in the same shard whatever the filters, the order of the plan or the machine, and
    a CI job matrix of N jobs runs every task exactly once. Each shard's document says which shard
    it is and how many tasks the whole plan holds; the merge refuses documents of different runs
    (implementation, grid, shard count, platform), and remembers the shards that are missing. The
    gate then counts the baseline cells those shards hold as not judged, naming the shard, and exits
    2: a missing shard is never a pass.
"""

from __future__ import annotations

import hashlib
import re

from oracle import kernel_coverage
from oracle.cases import Case
from oracle.report.results import MIXED_HOSTS, SCHEMA, data_identity, run_noise_model, summarize


def parse(text: str) -> tuple[int, int]:
    """``K/N`` -> (K, N), 1 <= K <= N."""
    match = re.fullmatch(r"(\d+)/(\d+)", text or "")
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise ValueError(f"--shard wants K/N with 1 <= K <= N, got {text!r}")
    return int(match.group(1)), int(match.group(2))


def task_shard(case: Case, check: str | None, count: int) -> int:
    """The 1-based shard a case (or one aliasing check of it) belongs to."""
    return identity_shard(data_identity(case) + (f"/{check}" if check else ""), count)


def identity_shard(identity: str, count: int) -> int:
    return int(hashlib.sha256(identity.encode()).hexdigest()[:12], 16) % count + 1


def select(tasks: list, index: int, count: int) -> list:
    return [task for task in tasks if task_shard(task.case, task.check, count) == index]


# What a shard's results depend on beside the code: shards that differ here are not one run's parts,
# and the merged run's environment is the first's. Hosts whose vector maths differ may share a run
# (a CI matrix over AVX2 and AVX-512 runners): see several_hosts.
_SAME_MACHINERY = {
    "platform": lambda document: document["environment"].get("platform"),
    "torch": lambda document: document["environment"].get("torch"),
    "triton": lambda document: document["environment"].get("triton"),
    "noise model": run_noise_model,
}


def several_hosts(maths: list[dict]) -> dict:
    """The shards' host maths, as one: the first's where all agree; else a digest that equals no
    host's, so that the gate applies no rule relative to HF's bits to the merged run (each shard's
    HF rounded otherwise) while every rule about the implementation alone still holds."""
    digests = sorted({m.get("digest") for m in maths if m.get("digest")})
    if len(digests) <= 1:
        return maths[0]
    return {"cpu": "several hosts", "cpu_capability": "/".join(sorted({str(m.get("cpu_capability")) for m in maths})),
            "numpy_simd": [], "digest": MIXED_HOSTS + ",".join(digests)}


def merge(documents: list[dict], names: list[str]) -> dict:
    """One document from the shards of one run; ``shards`` says which were there and which not."""
    if not documents:
        raise ValueError("--merge needs the shards' JSON files")
    first = documents[0]
    identity = ("impl", "sweep")
    counts = set()
    for document, name in zip(documents, names):
        if document.get("schema") != SCHEMA:
            raise ValueError(f"{name} is not a report of schema {SCHEMA!r}")
        shard = document.get("shard")
        if not isinstance(shard, dict):
            raise ValueError(f"{name} is not a shard (it was run without --shard)")
        counts.add(shard["count"])
        for field in identity:
            if document.get(field) != first.get(field):
                raise ValueError(f"{name} is a shard of another run: its {field} is {document.get(field)!r}, "
                                 f"{names[0]}'s {first.get(field)!r}")
        for what, read in _SAME_MACHINERY.items():
            if read(document) != read(first):
                raise ValueError(f"{name} ran with another {what} than {names[0]} ({read(document)!r}, "
                                 f"not {read(first)!r}): its cells are not the same run's")
    if len(counts) != 1:
        raise ValueError(f"the shards split the sweep differently: into {sorted(counts)} parts")
    count = counts.pop()
    present = sorted({d["shard"]["index"] for d in documents})
    seen_twice = len(present) != len(documents)
    if seen_twice:
        raise ValueError("a shard is given twice: " + ", ".join(f"{n} ({d['shard']['index']}/{count})"
                                                                 for d, n in zip(documents, names)))
    environment = dict(first["environment"])
    environment["host_maths"] = several_hosts([d["environment"].get("host_maths") or {} for d in documents])
    cells = [c for d in documents for c in d["cells"]]
    cases = [r for d in documents for r in d["cases"]]
    checks = [c for d in documents for c in d["aliasing"]]
    return {
        # a shard run with --gate holds its own comparison: the merged run is compared afresh
        **{k: v for k, v in first.items()
           if k not in ("cells", "cases", "aliasing", "failures", "summary", "shard", "baseline")},
        "environment": environment,
        "seconds": sum(d.get("seconds", 0.0) for d in documents),
        "summary": summarize(cells, checks, cases),
        "cells": cells, "cases": cases, "aliasing": checks,
        "failures": [f for d in documents for f in d["failures"]],
        "kernel_coverage": _merged_kernel_coverage(documents),
        "shards": {"count": count, "present": present,
                   "missing": [k for k in range(1, count + 1) if k not in present]},
    }


def _merged_kernel_coverage(documents: list[dict]) -> dict:
    """The shards' kernel coverage as one run's: lines run by any shard are run (shards made before
    the key hold none)."""
    merged: dict = {}
    for document in documents:
        kernel_coverage.merge(merged, document.get("kernel_coverage") or {})
    return kernel_coverage.for_report(merged)


def missing_shard(cell: dict, document: dict) -> int | None:
    """The missing shard a baseline cell belongs to, when ``document`` is a merge that lacks it."""
    shards = document.get("shards")
    if not isinstance(shards, dict) or not shards.get("missing") or not isinstance(cell.get("identity"), str):
        return None
    shard = identity_shard(cell["identity"], shards["count"])
    return shard if shard in shards["missing"] else None
