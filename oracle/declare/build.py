"""Building the OpSpec of a declaration (an ``Op``): its hypothesis cases, stratified cases, the
report's and the scale grids, float64 cases and pinned regressions, how a case's tensors are made,
how it splits into programs (oracle/declare/op.py, Note [Declaring an op]). The one case builder:
the built-in ops are declared with ``Op`` too."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import torch
from hypothesis import strategies as st

from oracle import cases as C
from oracle.cases import (FLOAT_DTYPES, GRAD_LAYOUTS, LAYOUTS, TILE_BOUNDARIES, Budget, Case, covering,
                          long_counts)
from oracle.cases.scale import row_count, rows
from oracle.checks.exact import promised
from oracle.checks.memory import FUSE_HEADS, FUSE_LAST_DIM
from oracle.declare.parts import PARAMETER_VALUES, Choice, Dim, Fixed, Integers, PerVariant, Positions
from oracle.declare.spec import OpSpec, Programs, fill, generator, layout_bshd, layout_last_two
from oracle.errors import DeclarationError

# --- the OpSpec --------------------------------------------------------------------------------------


def build_spec(op) -> OpSpec:
    """The OpSpec the harness runs, from a validated declaration."""
    layout_args = op.layout_tensors()
    return OpSpec(
        name=op.name, variants=tuple(op.variants), summary=op.summary or f"declared op {op.name}",
        arg_names=op.arg_names, call=_caller(op), outputs=tuple(op.outputs), differentiable=op.grads,
        reference=op.reference, reference_reordered=op.reordered, takes_compute=_takes_compute(op.reference),
        cases=lambda budget, dtypes=FLOAT_DTYPES: _cases(op, budget, dtypes), stratified=lambda dtype, budget:
        _stratified(op, dtype, budget), make_args=lambda case, device: _make_args(op, case, device),
        layout_args=layout_args, layout_of=op.layout_of or layout_last_two, sweep=lambda full: _sweep(op, full),
        scale=lambda: _scale(op), programs=_programs(op),
        float64_cases=tuple(_float64_cases(op)), buffers_hold_outputs=dict(op.writes_into),
        may_clobber=tuple(op.may_clobber), exact=promised(op.exact, (*op.outputs, *(f"d{name}" for name in op.grads))),
        fusion=_fusion(op, layout_args),
        error_inputs=op.error_inputs if callable(op.error_inputs) else (lambda: list(op.error_inputs)),
        regressions=tuple(_case(op, given) for given in op.regressions),
        noise=dict(op.noise), order_noise=dict(op.order_noise), summed=dict(op.summed),
        long=lambda case: _is_long(op, case), hf=op.hf,
    )


def _takes_compute(reference: Callable) -> bool:
    """Whether the reference takes ``compute``, the dtype it upcasts to (as the built-in ones do): then
    its truth is itself computing in float64; otherwise its exact shadow evaluation (oracle/noise)."""
    try:
        return "compute" in inspect.signature(reference).parameters
    except (TypeError, ValueError):
        return False


def _caller(op) -> Callable:
    names = op.arg_names

    def call(fn, args):
        # an error input may leave out trailing params: the callee's defaults stand
        present = names[:next((i for i, n in enumerate(names) if n not in args), len(names))]
        out = fn(*[args[n] for n in present])
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if len(out) != len(op.outputs):
            raise TypeError(f"{op.name} returned {len(out)} value(s); the declaration names {len(op.outputs)} "
                            f"({', '.join(op.outputs)})")
        return out

    return call


# --- sizes: an int per dim, a list for a split dim ------------------------------------------------------


def _total(size) -> int:
    """A dim's size: a split dim's is the product of its list."""
    return math.prod(size) if isinstance(size, (list, tuple)) else size


def _sized(dim: Dim, n: int):
    """The size nearest below ``n`` that the dim allows, as a case records it (a split dim's: [n]; a
    per-row one's: one row of n)."""
    if dim.per_row:
        return [1, max(1, min(dim.high, n))]
    return [max(1, min(dim.high, n))] if dim.split > 1 else dim.fit(n)


def _halved(dim: Dim, size):
    """About half of ``size`` (a split dim's largest part halved); as large where it cannot shrink."""
    if dim.split == 1:
        return dim.fit(size // 2)
    parts = list(size)
    largest = parts.index(max(parts))
    parts[largest] = max(1, parts[largest] // 2)
    return parts


def _capped(dim: Dim, size, n: int):
    """``size`` shrunk until it is at most ``n`` (or can shrink no further)."""
    if dim.split == 1:
        return dim.fit(min(size, n))
    while _total(size) > n and _total(_halved(dim, size)) < _total(size):
        size = _halved(dim, size)
    return list(size)


def _related(op, sizes: dict) -> dict:
    """Sizes that respect the dims' relations: a ``multiple_of`` size rounded down to a multiple of
    the other's (never below it), an ``at_least`` one raised to the other's."""
    sizes = dict(sizes)
    for name, dim in op.dims.items():
        if dim.multiple_of is not None:
            other = _total(sizes[dim.multiple_of])
            sizes[name] = max(1, sizes[name] // other) * other
        if dim.at_least is not None:
            sizes[name] = max(sizes[name], _total(sizes[dim.at_least]))
    return sizes


def _copied(sizes: dict) -> dict:
    return {name: list(size) if isinstance(size, (list, tuple)) else size for name, size in sizes.items()}


# --- cases ----------------------------------------------------------------------------------------------


def _largest(op, dims: dict) -> int:
    return max(math.prod(t.shape(dims)) for t in op.inputs.values())


def _fit(op, dims: dict, elements: int, programs: int | None) -> dict:
    """Halve sizes (the largest first, the programs dim last) until every tensor holds at most
    ``elements`` and the programs dim at most ``programs``."""
    dims = dict(dims)
    p = op.programs_dim
    if p is not None and programs is not None:
        dims[p] = _capped(op.dims[p], dims[p], programs)
    while _largest(op, dims) > elements:
        halvable = [n for n in dims if _total(_halved(op.dims[n], dims[n])) < _total(dims[n])]
        shrinkable = [n for n in halvable if n != p] or halvable
        if not shrinkable:
            break
        biggest = max(shrinkable, key=lambda n: _total(dims[n]))
        dims[biggest] = _halved(op.dims[biggest], dims[biggest])
    return dims


def _size(dim: Dim, high: int | None = None) -> st.SearchStrategy:
    """A size up to ``high`` (default: the dim's), special sizes two times in three; a split dim's,
    1 to ``split`` sizes whose product is at most that (where the dim declares special sizes, the
    product is one of them half the time: element counts a kernel's blocks split). Shrinks toward
    the smallest."""
    high = dim.high if high is None else max(dim.fit(dim.low), min(dim.high, high))
    special = [s for s in dim.special if dim.low <= s <= high]
    if dim.split > 1:
        least = 2 if dim.per_row else 1
        if special:  # half special, half anywhere up to ``high``: the element counts past the tiles
            return _split(dim.split, st.one_of(st.sampled_from(special), st.integers(1, high)), least)
        return _parts(dim.split, high, least)
    m = dim.multiple
    plain = st.integers(-(-dim.low // m), high // m).map(lambda k: k * m)
    return st.one_of(st.sampled_from(special), st.sampled_from(special), plain) if special else plain


@st.composite
def _parts(draw, count: int, high: int, least: int = 1) -> list[int]:
    """``least`` to ``count`` sizes whose product is at most ``high`` (each at least 1); shrinks toward
    [1] (or ``least`` ones)."""
    parts, room = [], max(1, high)
    for _ in range(draw(st.integers(least, count))):
        parts.append(draw(st.integers(1, room)))
        room = max(1, room // parts[-1])
    return parts


@st.composite
def _split(draw, count: int, totals: st.SearchStrategy[int], least: int = 1) -> list[int]:
    """``least`` to ``count`` sizes whose product is a drawn total rounded down to a multiple of the
    last: the last (a row's columns) drawn first, the rest splitting the rows it leaves; shrinks
    toward the smallest total in one column."""
    total = draw(totals)
    n = draw(st.integers(least, count))
    last = draw(st.integers(1, max(1, total))) if n > 1 else max(1, total)
    parts, room = [], max(1, total) // last
    for _ in range(n - 2):
        parts.append(draw(st.integers(1, room)))
        room = max(1, room // parts[-1])
    return parts + [room, last] if n > 1 else [last]


def params_of(op, variant: str, choose: Callable[[str, tuple], object]) -> dict:
    """The params a case records: a variant's fixed ones, ``choose(name, values)`` for each choice (a
    ``Choice``, a bare tuple: its older spelling, or a ``DtypeChoice``), the rest as declared
    (``Fixed`` unwrapped). A ``PerVariant`` is not recorded: the case's variant says it."""
    out = {}
    for name, value in op.params.items():
        if isinstance(value, PerVariant):
            continue
        if name in op.variants[variant]:
            value = op.variants[variant][name]
            out[name] = value.value if isinstance(value, Fixed) else value
        elif isinstance(value, Choice):
            out[name] = choose(name, value.values)
        elif isinstance(value, tuple):
            out[name] = choose(name, value)
        else:
            out[name] = value.value if isinstance(value, Fixed) else value
    for name, choice in op.dtype_choices().items():
        out[name] = choose(name, tuple(choice.choices))
    return out


def _cases(op, budget: Budget, dtypes) -> st.SearchStrategy[Case]:
    dtypes = [d for d in dtypes if d in op.dtypes or d == "float64"] or list(op.dtypes)
    layouts = LAYOUTS if op.layout_tensors() else ("contiguous",)
    grad_layouts, grad_kinds = _gradient_axes(op)

    @st.composite
    def draw(draw):
        variant = draw(st.sampled_from(tuple(op.variants)))
        sizes = _related(op, _drawn_sizes(draw, op, budget))
        values = draw(st.sampled_from(op.value_kinds))
        return Case(op=op.name, variant=variant, dtype=draw(st.sampled_from(dtypes)), dims=sizes,
                    layout=draw(st.sampled_from(layouts)), values=values,
                    params=params_of(op, variant, lambda name, choices: draw(st.sampled_from(choices))),
                    seed=draw(C.seeds()), grad_layout=draw(st.sampled_from(grad_layouts)),
                    grad_values=C.grad_kind_for(values, draw(st.sampled_from(grad_kinds))))

    return draw()


def _split_high(dim: Dim, budget: Budget) -> int | None:
    """A split dim's parts are drawn within the budget, not cut down to it afterwards: at most its
    elements in all, and a per-row dim (flat blocks of an element-wise kernel, each a program) at
    most its programs' blocks."""
    if dim.split == 1:
        return None
    return min(budget.elements, budget.programs * C.FLAT_BLOCK) if dim.per_row else budget.elements


def _drawn_sizes(draw, op, budget: Budget) -> dict:
    """Every dim's size within the budget. The programs dim is drawn after the others, within the
    room they leave (few programs of wide rows, many of narrow ones); a third of the cases (long)
    take it just past the kernels' tiles, the other sizes shrunk to the long regime's elements."""
    p = op.programs_dim
    long = p is not None and draw(C.is_long())
    sizes = {name: draw(_size(dim, _split_high(dim, budget))) for name, dim in op.dims.items() if name != p}
    if p is None:
        return _fit(op, sizes, budget.elements, budget.programs)
    dim = op.dims[p]
    if long:
        count = draw(long_counts(budget))
        two = dim.split > 1 and count > 1 and not draw(st.booleans())
        sizes[p] = [2, -(-count // 2)] if two else _sized(dim, count)
        return _fit(op, sizes, budget.long_elements, None)
    sizes = _fit(op, {**sizes, p: _sized(dim, dim.low)}, budget.elements, None)
    room = min(budget.programs, budget.elements // max(1, _largest(op, sizes)))
    sizes[p] = draw(_size(dim, room))
    return _fit(op, sizes, budget.elements, budget.programs)


_SHORT_SIZES = (7, 129, 33, 64, 255, 5)


def _short(op, i: int) -> dict:
    """Small sizes: the programs dim 3 (a split one 3 x 5, two dims to merge), the others cycling
    through _SHORT_SIZES."""
    sizes = {}
    for j, (name, dim) in enumerate(op.dims.items()):
        if dim.programs:
            sizes[name] = [3, 5] if dim.split > 1 else dim.fit(3)
        elif dim.per_row:  # three rows, within one 1024-element block
            sizes[name] = [3, _SHORT_SIZES[(i + j) % len(_SHORT_SIZES)]]
        else:
            sizes[name] = _sized(dim, _SHORT_SIZES[(i + j) % len(_SHORT_SIZES)])
    if op.programs_dim is None:  # short as _is_long measures it: at most four 1024-element blocks
        sizes = _fit(op, sizes, 4 * 1024, None)
    return sizes


def _long(op, i: int, budget: Budget) -> dict:
    """Past the tiles: the programs dim just past a tile boundary, the others small; with no
    programs dim, every size doubled until a tensor holds more than four 1024-element blocks."""
    # a per-row dim: five rows past four 1024-element blocks, the last block partial
    sizes = {name: [5, 1001 + 2 * i] if dim.per_row else _sized(dim, 5 + i) for name, dim in op.dims.items()}
    p = op.programs_dim
    if p is not None:
        sizes[p] = _sized(op.dims[p], C.long_rows(i // 2, budget))
        return _fit(op, sizes, budget.long_elements, None)
    while _largest(op, sizes) <= 4 * 1024:
        doubled = {n: _sized(op.dims[n], 2 * _total(s)) for n, s in sizes.items()}
        if all(_total(doubled[n]) <= _total(s) for n, s in sizes.items()):
            break
        sizes = doubled
    return sizes


def _is_long(op, case: Case) -> bool:
    p = op.programs_dim
    if p is not None:
        return _total(case.dims.get(p, 0)) > TILE_BOUNDARIES[0]
    return _largest(op, case.dims) > 4 * 1024


def _gradient_axes(op) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The gradient layouts and kinds an op's cases take: every one where it has gradients."""
    return (GRAD_LAYOUTS, tuple(op.grad_kinds)) if op.grads else (("contiguous",), ("normal",))


def _stratified(op, dtype: str, budget: Budget) -> list[Case]:
    """Every variant, layout, gradient layout, kind of values and kind of incoming gradient: the
    gradient kinds spread over the rows covering the rest where the values allow them
    (cases.spread_grad_kinds), a row of normal values for each kind left; every other case long.
    Variants cycle (a, b, b, a) and params' choices change every second case (0, 0, 1, 1, ...), so
    that each of two choices meets each of two variants, short and long (a float32 weight with
    Llama's cast). The widest cases turn with the dtype: their variant (float32 a, float16 b,
    bfloat16 a) and their kind of values (the op's first, second and third: RMSNorm's normal, large
    and tiny), so that each variant's wide path runs in some dtype (Gemma's split backward was never
    launched) and meets values where its roundings show (tiny ones, where eps dominates: an eps
    dropped from the looped forward passed every verdict on normal values)."""
    names = tuple(op.variants)
    cycle = tuple(names[i % len(names)] for i in (0, 1, 1, 0)) if len(names) > 1 else names
    layouts = LAYOUTS if op.layout_tensors() else ("contiguous",)
    grad_layouts, grad_kinds = _gradient_axes(op)
    covered = covering(cycle, layouts, grad_layouts, op.value_kinds)
    kinds, others = C.spread_grad_kinds([values for *_, values in covered], grad_kinds)
    rows = [(v, layout, g, kind, values) for (v, layout, g, values), kind in zip(covered, kinds)]
    rows += [(cycle[(len(rows) + j) % len(cycle)], layouts[j % len(layouts)], grad_layouts[j % len(grad_layouts)],
              kind, "normal") for j, kind in enumerate(others)]
    out = []
    for i, (variant, layout, grad_layout, grad_values, values) in enumerate(rows):
        sizes = _related(op, _long(op, i, budget) if i % 2 else _short(op, i))
        params = params_of(op, variant, lambda name, choices: choices[i // 2 % len(choices)])
        out.append(Case(op.name, variant, dtype, sizes, layout, values, params, seed=1000 + i, grad_layout=grad_layout,
                        grad_values=grad_values))
    widest = max((_largest(op, c.dims) for c in out), default=0)
    turn = FLOAT_DTYPES.index(dtype) if dtype in FLOAT_DTYPES else 0
    for j, sizes in enumerate(s for s in _widest(op, budget) if _largest(op, s) > widest):
        variant = names[(j + turn) % len(names)]
        out.append(Case(op.name, variant, dtype, sizes, "contiguous", op.value_kinds[(j + turn) % len(op.value_kinds)],
                        params_of(op, variant, lambda name, choices: choices[0]), seed=1000 + len(rows) + j))
    return out


def _widest(op, budget: Budget) -> list[dict]:
    """Per dim (neither the programs dim nor a per-row one) with special sizes: the largest of them,
    not a power of two, that a tensor of the budget holds, every other dim small. A kernel that takes another path for wide
    rows (RMSNorm's looped forward and split backward past 16384 columns) is run there in every
    profile, not only when hypothesis happens to draw that wide (mutation testing found both paths
    never launched by the CI profile's cases on a CPU)."""
    small = {n: _sized(d, 1 if d.programs else 7) for n, d in op.dims.items()}
    out = []
    for name, dim in op.dims.items():
        if dim.programs or dim.per_row or not dim.special:
            continue
        # not a power of two: the wide path's last step is partial, where a loop that misses its
        # tail or a mask off by one shows (65536 columns passed both)
        for size in sorted((s for s in dim.special if dim.low <= s <= dim.high and s & (s - 1)), reverse=True):
            sizes = _related(op, {**small, name: _sized(dim, size)})
            if _largest(op, sizes) <= budget.elements:
                out.append(sizes)
                break
    return out


def _default_grid(op, full: bool) -> list[dict]:
    """Small, medium and long sizes: every dim at a small size, at a medium one, and (with a
    programs dim) many programs of small rows; the full grid's are larger."""
    medium = 4097 if full else 1000
    grids = [{n: _sized(d, 7) for n, d in op.dims.items()},
             {n: _sized(d, 24 if d.programs else medium) for n, d in op.dims.items()}]
    p = op.programs_dim
    if p is not None:
        grids.append({n: _sized(d, (4100 if full else 300) if d.programs else 16) for n, d in op.dims.items()})
    budget = C.GPU_BUDGET if full else C.CPU_BUDGET
    return [_fit(op, g, budget.elements if full else 2**15, None) for g in grids]


def _past_the_medium(op, full: bool) -> list[dict]:
    """The default grid's special sizes: each size a dim declares special above the medium one (the
    block edges a declaration names, 1025 or 4097 columns: where a kernel that drops its last partial
    block goes wrong, and the medium 1000 never reaches), the other dims small, shrunk (never the
    special one) to the grid's budget. A size no tensor of that budget can hold is left out."""
    medium, elements = (4097, C.GPU_BUDGET.elements) if full else (1000, 2**15)
    small = {n: _sized(d, 7) for n, d in op.dims.items()}
    out = []
    for name, dim in op.dims.items():
        for size in sorted({s for s in dim.special if s > medium and dim.low <= s <= dim.high}):
            sizes = {**small, name: _sized(dim, size)}
            while _largest(op, sizes) > elements:
                others = [n for n in sizes if n != name and
                          _total(_halved(op.dims[n], sizes[n])) < _total(sizes[n])]
                if not others:
                    break
                biggest = max(others, key=lambda n: _total(sizes[n]))
                sizes[biggest] = _halved(op.dims[biggest], sizes[biggest])
            if _largest(op, sizes) <= elements:
                out.append(sizes)
    return out


def is_point(entry) -> bool:
    return isinstance(entry, dict) and "dims" in entry


def _sweep(op, full: bool) -> list[Case]:
    declared = op.full_sweep if full and op.full_sweep else op.sweep
    if declared and is_point(declared[0]):
        return _points(op, declared)
    grids = list(declared) or _default_grid(op, full)
    layouts = op.layout_tensors()
    out = []
    for variant in op.variants:
        for dtype in op.dtypes:
            for sizes in grids:
                out.append(Case(op.name, variant, dtype, _copied(sizes), "contiguous", "normal",
                                params_of(op, variant, lambda n, c: c[0]), seed=len(out)))
            if layouts:  # the medium size in HF's column-major layout, with a strided gradient
                out.append(Case(op.name, variant, dtype, _copied(grids[min(1, len(grids) - 1)]), "transposed",
                                "normal", params_of(op, variant, lambda n, c: c[0]), seed=len(out),
                                grad_layout="strided" if op.grads else "contiguous"))
            out.append(Case(op.name, variant, dtype, _copied(grids[0]), "contiguous",
                            "large" if "large" in op.value_kinds else op.value_kinds[0],
                            params_of(op, variant, lambda n, c: c[-1]), seed=len(out)))
    if not declared:  # appended: the cases above keep their seeds
        out += [Case(op.name, variant, dtype, sizes, "contiguous", "normal", params_of(op, variant, lambda n, c: c[0]),
                     seed=len(out) + i) for i, (variant, dtype, sizes) in
                enumerate((v, d, s) for v in op.variants for d in op.dtypes for s in _past_the_medium(op, full))]
    return out


def _points(op, points) -> list[Case]:
    """A grid taken as written: per variant and dtype, one case per point (of the point's ``dtypes``
    and ``variants``, where it names them), seeded in order."""
    out = []
    for variant in op.variants:
        for dtype in op.dtypes:
            for point in points:
                if dtype in point.get("dtypes", op.dtypes) and variant in point.get("variants", op.variants):
                    given = {key: value for key, value in point.items() if key not in ("dtypes", "variants")}
                    out.append(_case(op, {**given, "variant": variant, "dtype": dtype, "seed": len(out)}))
    return out


def _scale(op) -> list[Case]:
    return _points(op, [entry if is_point(entry) else {"dims": entry} for entry in op.scale])


def _case(op, given: dict) -> Case:
    """A case from a dict of its fields (a grid's point, a pinned or float64 case): ``dims`` given; the
    first variant and dtype, contiguous normal values, the params' first choices (those ``params``
    gives replaced) and seed 0 otherwise."""
    variant = given.get("variant", next(iter(op.variants)))
    params = params_of(op, variant, lambda name, choices: choices[0]) | dict(given.get("params", {}))
    return Case(op.name, variant, given.get("dtype", op.dtypes[0]), _copied(given["dims"]),
                given.get("layout", "contiguous"), given.get("values", "normal"), params, seed=given.get("seed", 0),
                grad_layout=given.get("grad_layout", "contiguous"), grad_values=given.get("grad_values", "normal"))


def _float64_cases(op) -> list[Case]:
    if op.float64_cases:
        return [_case(op, {**given, "dtype": "float64"}) for given in op.float64_cases]
    return [Case(op.name, variant, "float64", _short(op, 0), "contiguous", "normal",
                 params_of(op, variant, lambda n, c: c[0]), seed=1) for variant in op.variants]


# --- tensors ---------------------------------------------------------------------------------------------


def _make_args(op, case: Case, device) -> dict:
    args = {}
    for name, tensor in op.inputs.items():
        shape, dtype = tensor.shape(case.dims), tensor.dtype_in(case.dtype, case.params)
        gen = generator(case, name)
        values = tensor.values.values[case.variant] if isinstance(tensor.values, PerVariant) else tensor.values
        if values is None:  # left out: the op's default
            args[name] = None
        elif isinstance(values, Integers):
            args[name] = values.make(shape, case.dims, gen, dtype).to(device)
        elif isinstance(values, Positions):
            args[name] = values.make(shape, case.params, gen).to(dtype).to(device)
        elif callable(values) and _takes_params(values):
            args[name] = values(shape, dtype, gen, torch.device(device), params=case.params)
        elif callable(values):
            args[name] = values(shape, dtype, gen, torch.device(device))
        elif values in PARAMETER_VALUES:
            args[name] = _parameter(values, shape, gen).to(dtype).to(device)
        else:
            args[name] = fill(shape, dtype, case.values if values == "case" else values, gen, device)
    return args | _passed_params(op, case)


def _takes_params(values: Callable) -> bool:
    try:
        return "params" in inspect.signature(values).parameters
    except (TypeError, ValueError):
        return False


def _passed_params(op, case: Case) -> dict:
    """The params the reference takes: a PerVariant's by the case's variant, the others as the case
    records them (a param a case does not record takes its first value: a case made before it was
    declared)."""
    first = params_of(op, case.variant, lambda name, choices: choices[0])
    out = {}
    for name, value in op.params.items():
        if isinstance(value, PerVariant):
            out[name] = value.values[case.variant]
        elif isinstance(value, Choice) and not value.passed:
            continue
        else:
            out[name] = _plain(case.params[name]) if name in case.params else first[name]
    return out


def _parameter(kind: str, shape, gen) -> torch.Tensor:
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    if kind == "weight":
        return 1 + 0.1 * x
    if kind == "small":
        return 0.1 * x
    if kind == "positive":
        return x.abs() + 0.1
    return torch.softmax(x, dim=-1)  # probabilities


def _plain(value):
    """Case params come back from JSON: lists for tuples."""
    return tuple(value) if isinstance(value, list) else value


# --- programs (scale), fusion ------------------------------------------------------------------------


def _programs(op) -> Programs | None:
    """Along the programs dim, for an op with a scale grid (the only cases judged on a slice):
    every tensor holding that dim holds it first, and so does every output. A split programs dim's
    sizes are flattened into one (an output's, as the first input holding it has its other dims)."""
    p = op.programs_dim
    per_row = next((name for name, dim in op.dims.items() if dim.per_row), None)
    if p is None and per_row is not None and op.scale:
        return _row_programs(op, per_row)
    if p is None or not op.scale:
        return None
    if op.layout_of is layout_bshd and any(p in t.dims[1:] for t in op.inputs.values()):
        return _programs_within(op, p)
    if any(p in t.dims[1:] for t in op.inputs.values()):
        raise DeclarationError(f"op {op.name!r}: scale: the programs dim {p!r} must come first in every tensor")
    holders = {n: len(t.dims) - 1 for n, t in op.inputs.items() if t.dims[:1] == (p,)}  # name -> dims after p
    if any(op.dims[d].split > 1 for n in holders for d in op.inputs[n].dims[1:] if isinstance(d, str)):
        raise DeclarationError(f"op {op.name!r}: scale: only the programs dim {p!r} may split in a tensor holding it")
    dim, trailing = op.dims[p], next(iter(holders.values()), 0)

    def flat(t: torch.Tensor, after: int) -> torch.Tensor:
        return t.reshape(-1, *t.shape[t.dim() - after:]) if dim.split > 1 else t

    def size(case: Case) -> tuple[int, int]:
        return _total(case.dims[p]), _largest(op, case.dims)

    def args(a: dict, index: torch.Tensor) -> dict:
        return {n: flat(v, holders[n]).index_select(0, index.to(v.device)) if n in holders else v
                for n, v in a.items()}

    return Programs(unit=dim.programs if isinstance(dim.programs, str) else p, size=size, args=args,
                    tensor=lambda t, index: flat(t, trailing).index_select(0, index.to(t.device)),
                    summed_gradients=tuple("d" + n for n in op.grads if n not in holders))


def _row_programs(op, dim: str) -> Programs:
    """Along the rows of a per-row dim (an element-wise op's shape): every tensor holding it is that
    shape alone, sliced alike, and so is every output."""
    holders = {n for n, t in op.inputs.items() if dim in t.dims}
    if any(op.inputs[n].dims != (dim,) for n in holders):
        raise DeclarationError(f"op {op.name!r}: scale: a tensor holding the per-row dim {dim!r} holds it alone")

    def size(case: Case) -> tuple[int, int]:
        return row_count(case.dims[dim]), _largest(op, case.dims)

    def args(a: dict, index: torch.Tensor) -> dict:
        return {n: rows(v, index) if n in holders else v for n, v in a.items()}

    return Programs(unit="rows", size=size, args=args, tensor=rows,
                    summed_gradients=tuple("d" + n for n in op.grads if n not in holders))


def _programs_within(op, p: str) -> Programs:
    """Along a programs dim that is not every tensor's first (layout_bshd's seq, the tokens): each
    tensor holding it sliced where it holds it, the outputs and gradients where the first holder
    does. A tensor of positions left out is made explicit first (0..seq-1 in every row), as the
    slice would lose what it stands for."""
    where = {n: t.dims.index(p) for n, t in op.inputs.items() if p in t.dims}
    if op.dims[p].split > 1:
        raise DeclarationError(f"op {op.name!r}: scale: a programs dim {p!r} that is not first cannot split")
    first = next(iter(where.values()))

    def size(case: Case) -> tuple[int, int]:
        return case.dims[p], _largest(op, case.dims)

    def args(a: dict, index: torch.Tensor) -> dict:
        a = {n: _explicit_positions(op, n, a) if a[n] is None and n in where else v for n, v in a.items()}
        return {n: v.index_select(where[n], index.to(v.device)) if n in where and v is not None else v
                for n, v in a.items()}

    return Programs(unit=op.dims[p].programs if isinstance(op.dims[p].programs, str) else p, size=size, args=args,
                    tensor=lambda t, index: t.index_select(first, index.to(t.device)))


def _explicit_positions(op, name: str, a: dict) -> torch.Tensor | None:
    """The positions a left-out (batch, seq) tensor of ``Positions`` stands for, sized from a tensor
    given beside it that holds both dims; None for any other left-out tensor."""
    values = op.inputs[name].values
    kinds = values.values.values() if isinstance(values, PerVariant) else (values,)
    if not any(isinstance(k, Positions) for k in kinds):
        return None
    batch, seq = op.inputs[name].dims
    holder = next(n for n, t in op.inputs.items() if a.get(n) is not None and batch in t.dims and seq in t.dims)
    dims = op.inputs[holder].dims
    return Positions.default(a[holder].shape[dims.index(batch)], a[holder].shape[dims.index(seq)], a[holder].device)


def _fusion(op, layout_args: tuple[str, ...]):
    """Column blocks of one buffer, where the layout tensors share every dim but the last; with
    layout_bshd, heads of one fused QKV projection, where they share every dim but the heads."""
    leading = {op.inputs[n].dims[:-1] for n in layout_args}
    if op.layout_of is layout_bshd:
        beside_heads = {op.inputs[n].dims[:1] + op.inputs[n].dims[2:] for n in layout_args}
        return FUSE_HEADS if layout_args and len(beside_heads) == 1 else None
    return FUSE_LAST_DIM if layout_args and len(leading) == 1 else None
