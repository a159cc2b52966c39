"""The derived noise model's results on a fixed set of cases, saved and compared bit for bit: the
check that a change meant to make oracle/noise cheaper changes none of its numbers.

For every op of oracle.declare.registry.SPECS (the built-in ones and the declared ops of tests/declared_project),
every float dtype and the first ``--cases`` stratified cases of each, under both noise models
(ORACLE_NOISE_MODEL=declared and derived), it keeps what ``engine.prepare`` gives the verdict
(element noise, order noise, the noise without fast maths' room, the typical room, truth and the
other order, the generic ops) and the derived model itself (``noise.derive``: truth, variance,
order and fast variances, generic; ``noise.reordered``).

    python scripts/noise_invariance.py save /tmp/noise-before
    python scripts/noise_invariance.py compare /tmp/noise-before      # exit 1 on any difference
    python scripts/noise_invariance.py compare /tmp/noise-before --against a8a1232

Tensors are compared by their bits (NaN included), dtypes, shapes and strides. ``--against COMMIT``
also checks every single op's propagation on the way: oracle/noise/rules.py and rounding.py of that
commit are loaded beside the current ones, and each ``rules.propagate`` call (every aten op of every
case) must give the same variances, bit for bit and stride for stride, and count the same generic ops.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "declared_project"))

from oracle import engine, noise  # noqa: E402
from oracle.cases import CPU_BUDGET, FLOAT_DTYPES  # noqa: E402
from oracle.declare.registry import load_declarations  # noqa: E402

load_declarations("declared_ops")
from oracle.declare.registry import SPECS  # noqa: E402

MODELS = ("declared", "derived")


def _flat(prefix: str, value, out: dict) -> None:
    if value is None:
        return
    if isinstance(value, torch.Tensor):
        out[prefix] = value.detach().cpu()
    elif isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}.{k}", v, out)
    elif isinstance(value, (int, float, str)):
        out[prefix] = value
    else:
        raise TypeError(f"{prefix}: {type(value)}")


def results(spec, case, device) -> dict:
    out = {}
    for model in MODELS:
        os.environ["ORACLE_NOISE_MODEL"] = model
        p = engine.prepare(spec, case, device)
        for field in ("element_noise", "order_noise", "exact_noise", "typical_room", "sum_noise", "generic"):
            _flat(f"{model}.{field}", getattr(p, field), out)
        _flat(f"{model}.truth", p.truth.tensors(), out)
        _flat(f"{model}.reordered", p.reordered.tensors(), out)
        out[f"{model}.noise_model"] = p.noise_model
    os.environ.pop("ORACLE_NOISE_MODEL", None)
    # the derived model itself, and the other order, on the prepared case's arguments
    args = spec.make_args(case, device)
    forward = engine.evaluate(spec, spec.reference, args, None)
    upstream = ({n: engine.upstream_gradient(case, n, o) for n, o in forward.outputs.items()}
                if spec.differentiable else {})
    compute = engine._compute(case)
    d = noise.derive(spec, args, upstream, compute)
    for field in ("truth", "variance", "order_variance", "fast_variance", "generic"):
        _flat(f"derive.{field}", getattr(d, field), out)
    _flat("derive.reordered", noise.reordered(spec, args, upstream, compute), out)
    return out


# A case of the size hypothesis draws (2^17 elements), where an op's dims allow it: sizes matter to
# vectorised float64 kernels and to the cost measured.
_BIG = {"cols": 4096, "rows": 32, "shape": [32, 4096], "vocab": 4096, "tokens": 32, "lead": [32]}


class _Mismatch(AssertionError):
    pass


def _reference_rules(commit: str):
    """oracle/noise/rules.py and rounding.py as they were at ``commit``, as modules of oracle.noise."""
    import importlib.util
    import subprocess
    import types
    modules = {}
    for name in ("rounding", "rules"):
        source = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:oracle/noise/{name}.py"], check=True,
                                capture_output=True, text=True).stdout
        module = types.ModuleType(f"oracle.noise._reference_{name}")
        module.__package__ = "oracle.noise"
        sys.modules[module.__name__] = module
        if name == "rules":
            source = source.replace("from . import rounding as R", "from . import _reference_rounding as R")
        exec(compile(source, f"{commit}:oracle/noise/{name}.py", "exec"), module.__dict__)
        modules[name] = module
    return modules["rules"]


RECORD_KINDS = ("accumulated", "summed")


def _variances_only(kinds: dict | None) -> dict | None:
    return None if kinds is None else {kind: v for kind, v in kinds.items() if kind not in RECORD_KINDS}


def _check_every_op(commit: str) -> None:
    """Wrap rules.propagate: each call also runs the reference commit's propagate and must agree."""
    from collections import Counter
    from types import SimpleNamespace

    from oracle.noise import rules
    reference = _reference_rules(commit)
    new = rules.propagate

    def propagate(call, outs, dtypes, floating, state):
        before = Counter(state.generic)
        got = new(call, outs, dtypes, floating, state)
        shadow_state = SimpleNamespace(generic=Counter(before), mode=state.mode)
        want = reference.propagate(call, outs, dtypes, floating, shadow_state)
        if shadow_state.generic != state.generic:
            raise _Mismatch(f"{call.func}: generic counts differ")
        for j, (g, w) in enumerate(zip(got, want)):
            # a sum's record (rules.Accumulated, Note [One long sum]) is not a variance: an older rules.py
            # has none, or names it "summed"
            g, w = _variances_only(g), _variances_only(w)
            if (g is None) != (w is None) or (g is not None and set(g) != set(w)):
                raise _Mismatch(f"{call.func} output {j}: kinds differ")
            for kind in (g or {}):
                if not _same(g[kind], w[kind]):
                    raise _Mismatch(f"{call.func} output {j} {kind}: differs")
        return got

    rules.propagate = propagate


def _cases(spec, dtype, count):
    cases = spec.stratified(dtype, CPU_BUDGET)
    chosen = cases[:count]
    first = cases[0]
    if set(first.dims) & set(_BIG) and not set(first.dims) - set(_BIG):
        chosen.append(dataclasses.replace(first, dims={k: _BIG[k] for k in first.dims}, values="outliers"))
    return chosen


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        return False
    if not isinstance(a, torch.Tensor):
        return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)  # NaN is NaN
    if a.dtype != b.dtype or a.shape != b.shape or a.stride() != b.stride():
        return False
    if a.dtype.is_floating_point:
        bits = {8: torch.int64, 4: torch.int32, 2: torch.int16}[a.element_size()]
        return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))
    return torch.equal(a, b)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("save", "compare"))
    parser.add_argument("directory", type=Path)
    parser.add_argument("--ops", nargs="*", default=None)
    parser.add_argument("--dtypes", nargs="*", default=list(FLOAT_DTYPES))
    parser.add_argument("--cases", type=int, default=3, help="stratified cases per op and dtype")
    parser.add_argument("--against", help="a commit whose rules.py each op's propagation is checked against")
    args = parser.parse_args(argv)
    if args.against:
        _check_every_op(args.against)
    device = torch.device("cpu")
    args.directory.mkdir(parents=True, exist_ok=True)
    failures, total = 0, 0.0
    for name, spec in SPECS.items():
        if args.ops and name not in args.ops:
            continue
        for dtype in args.dtypes:
            for i, case in enumerate(_cases(spec, dtype, args.cases)):
                torch.manual_seed(0)
                start = time.perf_counter()
                got = results(spec, case, device)
                seconds = time.perf_counter() - start
                total += seconds
                path = args.directory / f"{name}-{dtype}-{i}.pt"
                if args.action == "save":
                    torch.save(got, path)
                    print(f"{name} {dtype} {i}: {len(got)} entries, {seconds:.1f} s", flush=True)
                    continue
                want = torch.load(path)
                bad = sorted(set(want) ^ set(got)) + [k for k in want if k in got and not _same(want[k], got[k])]
                failures += bool(bad)
                print(f"{name} {dtype} {i}: {'DIFFERENT ' + ', '.join(bad[:8]) if bad else 'identical'} "
                      f"({seconds:.1f} s)", flush=True)
    print(f"total {total:.1f} s; {failures} cases differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
