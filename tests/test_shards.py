"""Sweeps split over machines (oracle/report/shards.py, Note [Shards]): the union of N shards is the
unsharded run, cell for cell, and a missing shard leaves its cells not judged, never passed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracle.declare.registry import SPECS
from oracle.report import shards, sweep
from tests.conftest import once_per_session, report_runs

SLICE = ("--ops", "swiglu_fg_kernel", "--dtypes", "float32", "--workers", "1")  # 5 cases and 2 checks


def _runs(folder: Path) -> dict:
    """The slice unsharded (stored as its own baseline) and in two shards."""
    whole = {"json": folder / "whole.json", "baseline": folder / "baseline.json"}
    shard = [folder / f"shard-{k}.json" for k in (1, 2)]
    runs = {"whole": [*SLICE, "--json", whole["json"], "--html", folder / "whole.html", "--update-baseline",
                      "--baseline", whole["baseline"]]}
    runs |= {f"{k}/2": [*SLICE, "--shard", f"{k}/2", "--json", path, "--html", folder / f"shard-{k}.html"]
             for k, path in zip((1, 2), shard)}
    # Each in a fresh process, as shards run on machines of their own: in a pytest worker the runs
    # inherited what earlier tests left in the process, and the first run's mean errors differed from
    # the shards' in the 11th digit on one cell (under the whole suite only).
    for name, proc in report_runs(runs).items():
        assert proc.returncode == 0, f"{name}: {proc.stdout}{proc.stderr}"
    return {"whole": {name: str(path) for name, path in whole.items()}, "sharded": list(map(str, shard))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    return once_per_session(tmp_path_factory, "shards", _runs)


@pytest.fixture(scope="module")
def whole(runs) -> dict:
    return runs["whole"]


@pytest.fixture(scope="module")
def sharded(runs) -> list[Path]:
    paths = [Path(p) for p in runs["sharded"]]
    documents = [json.loads(p.read_text()) for p in paths]
    assert [d["shard"]["index"] for d in documents] == [1, 2]
    assert all(d["shard"]["tasks"] and d["cells"] for d in documents), "a shard of the slice is empty"
    return paths


@pytest.fixture
def gate_merged(tmp_path, report_main):
    """``python -m oracle.report --merge ... --gate`` (its main, in-process): exit status and output."""
    def gate_it(shards_: list[Path], baseline: str, name: str) -> tuple[int, str]:
        code, out, _ = report_main("--merge", *shards_, "--json", tmp_path / f"{name}.json",
                                   "--html", tmp_path / f"{name}.html", "--gate", "--baseline", baseline)
        return code, out

    return gate_it


def _comparable(cell: dict) -> tuple:
    metrics = {k: v for k, v in (cell["metrics"] or {}).items()}
    return cell["key"], cell["identity"], cell["status"], json.dumps(metrics, sort_keys=True)


def test_every_task_is_in_exactly_one_shard():
    tasks = sweep.plan(False, list(SPECS)[:2], ["float32"], None)
    parts = [shards.select(tasks, k, 4) for k in (1, 2, 3, 4)]
    assert sorted(t.id for part in parts for t in part) == [t.id for t in tasks]
    assert all(parts), "a shard of this plan is empty"
    with pytest.raises(ValueError, match="K/N"):
        shards.parse("4/3")


def test_the_union_of_the_shards_is_the_unsharded_run(sharded, whole, tmp_path, gate_merged):
    code, out = gate_merged(sharded, whole["baseline"], "merged")
    assert code == 0, out
    merged, whole = json.loads((tmp_path / "merged.json").read_text()), json.loads(Path(whole["json"]).read_text())
    assert sorted(map(_comparable, merged["cells"])) == sorted(map(_comparable, whole["cells"]))
    assert len(merged["aliasing"]) == len(whole["aliasing"]) and merged["shards"]["missing"] == []
    assert "0 regressions; 0 baseline cells not judged" in out


def test_a_missing_shard_is_not_judged_and_not_a_pass(sharded, whole, gate_merged):
    code, out = gate_merged(sharded[:1], whole["baseline"], "one")
    assert code == 2, out
    assert "in shard 2/2, which is missing" in out and "shard(s) 2/2 missing" in out, out


def _shard_document(index: int, **environment) -> dict:
    from oracle.report.results import SCHEMA

    env = {"platform": "cpu-interpreter", "host_maths": {"digest": "aaaa"}, "torch": "2.13.0", "triton": "3.9.0"}
    return {"schema": SCHEMA, "impl": "kernels", "sweep": "quick", "environment": env | environment,
            "shard": {"index": index, "count": 2}, "cells": [], "cases": [], "aliasing": [], "failures": [],
            "baseline": {"deltas": ["stale"]}}


@pytest.mark.parametrize("field, other", [("torch", "2.12.0"), ("platform", "cuda-NVIDIA-H200"),
                                          ("noise_model", "derived")])
def test_shards_of_different_machinery_are_not_merged(field, other):
    merged = shards.merge([_shard_document(1), _shard_document(2)], ["a.json", "b.json"])
    assert merged["shards"]["missing"] == [] and "baseline" not in merged
    with pytest.raises(ValueError, match="b.json ran with another"):
        shards.merge([_shard_document(1), _shard_document(2, **{field: other})], ["a.json", "b.json"])


def test_shards_of_hosts_that_round_differently_merge_without_hf_relative_rules():
    """A CI matrix over AVX2 and AVX-512 runners: one run, whose HF bits no single host made."""
    from oracle.report import gate

    alike = shards.merge([_shard_document(1), _shard_document(2)], ["a.json", "b.json"])
    assert alike["environment"]["host_maths"] == {"digest": "aaaa"}
    mixed = shards.merge([_shard_document(1), _shard_document(2, host_maths={"digest": "bbbb"})], ["a.json", "b.json"])
    assert mixed["environment"]["host_maths"]["digest"] == "several:aaaa,bbbb"
    baseline = {"environment": {"host_maths": {"digest": "aaaa"}}}
    assert gate.same_host_maths(alike, baseline) and not gate.same_host_maths(mixed, baseline)
    assert not gate.same_host_maths(alike, mixed)  # a mixed run stored as the baseline: never alike
