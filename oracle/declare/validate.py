"""Checking a declaration (an ``Op``): the first problem found raises ``DeclarationError`` naming
the op, the field, what was given and what is expected (oracle/declare/op.py, Note [Declaring an op])."""

from __future__ import annotations

import keyword

from oracle.cases import FLOAT_DTYPES, GRAD_KINDS, GRAD_LAYOUTS, LAYOUTS, VALUE_KINDS
from oracle.checks.exact import CONTRACTS, form_problem
from oracle.declare.build import params_of
from oracle.declare.parts import (PARAMETER_VALUES, Choice, Dim, DtypeChoice, Integers, PerVariant, Positions,
                                  Tensor, torch_dtype)
from oracle.errors import DeclarationError

# --- validation: the first problem, naming the field ---------------------------------------------

# Fields that hold names (a tuple, or a list), and the grids (tuples of dicts of sizes).
_NAME_TUPLES = ("differentiable", "outputs", "may_clobber", "dtypes", "value_kinds", "grad_kinds")
_GRIDS = ("sweep", "full_sweep", "scale")
_CASE_LISTS = ("regressions", "float64_cases")
# Fields given as tuples (a list is kept as a tuple; ``exact`` may be a dict instead).
LISTED_FIELDS = _NAME_TUPLES + ("exact",) + _GRIDS + _CASE_LISTS


def validate(op) -> None:
    def fail(field_name: str, problem: str):
        raise DeclarationError(f"op {op.name!r}: {field_name}: {problem}")

    if not isinstance(op.name, str) or not op.name.isidentifier() or keyword.iskeyword(op.name):
        raise DeclarationError(f"op name must be a Python identifier (an implementation's attribute), got {op.name!r}")
    if not callable(op.reference):
        fail("reference", f"must be callable, got {type(op.reference).__name__}")
    if not isinstance(op.dims, dict):
        fail("dims", f"must be a dict of name -> Dim, got {type(op.dims).__name__}")
    if not isinstance(op.inputs, dict) or not op.inputs:
        fail("inputs", "must be a non-empty dict of name -> Tensor")
    if not isinstance(op.variants, dict) or not op.variants:
        fail("variants", "must be a non-empty dict of name -> the params it fixes")
    for name, tensor in op.inputs.items():
        _validate_tensor(op, name, tensor, fail)
    _validate_dims(op, fail)
    _validate_params(op, fail)
    _validate_names(op, fail)
    _validate_variants(op, fail)
    for grid in _GRIDS:
        _validate_grid(op, grid, fail)
    _validate_noise(op, fail)
    for field_name in _CASE_LISTS:
        _validate_cases(op, field_name, fail)
    if not isinstance(op.summary, str):
        fail("summary", f"must be a string, got {type(op.summary).__name__}")


def _names(field_name: str, value, what: str, fail) -> None:
    """A tuple (or list) of strings; a bare string is refused, never split into characters."""
    if isinstance(value, str):
        fail(field_name, f"must be a tuple of {what}, got the string {value!r}; for one name write ({value!r},)")
    if not isinstance(value, (tuple, list)):
        fail(field_name, f"must be a tuple of {what}, got {type(value).__name__} {value!r}")
    stray = [v for v in value if not isinstance(v, str)]
    if stray:
        fail(field_name, f"must be a tuple of {what}, got {tuple(value)!r}, where {stray[0]!r} is not a name")


def _validate_tensor(op, name, tensor, fail) -> None:
    if not isinstance(tensor, Tensor):
        fail(f"inputs[{name!r}]", f"must be an oracle.declare.Tensor, got {type(tensor).__name__}")
    if not isinstance(name, str) or not name.isidentifier():
        fail(f"inputs[{name!r}]", "the name must be an identifier")
    for d in tensor.dims:
        scaled = isinstance(d, tuple) and len(d) == 2 and isinstance(d[1], int) and d[1] >= 1
        named = d[0] if scaled else d
        if isinstance(named, str) and named not in op.dims:
            fail(f"inputs[{name!r}].dims", f"{named!r} is not one of dims ({', '.join(op.dims) or 'none declared'})")
        if not (scaled and isinstance(named, str)) and (not isinstance(d, (str, int)) or isinstance(d, bool)):
            fail(f"inputs[{name!r}].dims", f"{d!r} must be a dim's name, (a name, a factor) or an int")
        if scaled and isinstance(op.dims[named], Dim) and op.dims[named].split > 1:
            fail(f"inputs[{name!r}].dims", f"{d!r}: a split dim ({named!r}) takes no factor")
    _validate_dtype(op, name, tensor, fail)
    values = tensor.values
    if isinstance(values, PerVariant):
        if set(values.values) != set(op.variants):
            fail(f"inputs[{name!r}].values", f"PerVariant must give every variant ({', '.join(op.variants)}), got "
                                             f"{', '.join(values.values) or 'none'}")
        for kind in values.values.values():
            _validate_values(op, name, tensor, kind, fail)
    else:
        _validate_values(op, name, tensor, values, fail)
    if tensor.layout is not None and not isinstance(tensor.layout, bool):
        fail(f"inputs[{name!r}].layout", f"must be True, False or None, got {tensor.layout!r}")


def _validate_dtype(op, name: str, tensor: Tensor, fail) -> None:
    if isinstance(tensor.dtype, DtypeChoice):
        choice = tensor.dtype
        if not isinstance(choice.param, str) or not choice.param.isidentifier() or choice.param in op.params \
                or choice.param in op.inputs:
            fail(f"inputs[{name!r}].dtype", f"DtypeChoice's param {choice.param!r} must be an identifier that is "
                                            f"neither a param nor an input")
        for dtype in choice.choices.values():
            if dtype != "case" and not _is_floating_dtype(dtype):
                fail(f"inputs[{name!r}].dtype", f"DtypeChoice's choices are 'case' or floating dtypes, got {dtype!r}")
        if not choice.choices:
            fail(f"inputs[{name!r}].dtype", "DtypeChoice needs at least one choice")
    elif tensor.dtype != "case":
        try:
            tensor.fixed_dtype
        except ValueError:
            fail(f"inputs[{name!r}].dtype", f"{tensor.dtype!r} is not a torch dtype ('case', 'float32', "
                                            f"torch.int64, ...)")


def _is_floating_dtype(declared) -> bool:
    try:
        return torch_dtype(declared).is_floating_point
    except ValueError:
        return False


def _validate_values(op, name: str, tensor: Tensor, values, fail) -> None:
    if isinstance(values, str):
        if values != "case" and values not in VALUE_KINDS and values not in PARAMETER_VALUES:
            fail(f"inputs[{name!r}].values", f"{values!r} is none of 'case', {', '.join(VALUE_KINDS)}, "
                                             f"{', '.join(PARAMETER_VALUES)}")
        if not tensor.floating:
            fail(f"inputs[{name!r}].values", f"{values!r} draws floating values, and the dtype is "
                                             f"{tensor.fixed_dtype}: an integer or boolean tensor takes "
                                             f"Integers(low, high) or a callable (shape, dtype, generator, "
                                             f"device) -> tensor")
    elif isinstance(values, Integers):
        for bound in (values.low, values.high):
            if isinstance(bound, str) and bound not in op.dims:
                fail(f"inputs[{name!r}].values", f"Integers bound {bound!r} is not one of dims "
                                                 f"({', '.join(op.dims) or 'none declared'})")
            if not isinstance(bound, (str, int)) or isinstance(bound, bool):
                fail(f"inputs[{name!r}].values", f"Integers bounds are ints or dims' names, got {bound!r}")
    elif isinstance(values, Positions):
        if len(tensor.dims) != 2 or tensor.floating:
            fail(f"inputs[{name!r}].values", "Positions are a (batch, seq) tensor of an integer dtype")
    elif values is not None and not callable(values):
        fail(f"inputs[{name!r}].values", f"must be a kind's name, an Integers or a callable, got "
                                         f"{type(values).__name__} {values!r}")


def _validate_dims(op, fail) -> None:
    for name, dim in op.dims.items():
        if not isinstance(dim, Dim):
            fail(f"dims[{name!r}]", f"must be an oracle.declare.Dim, got {type(dim).__name__}")
        if not 1 <= dim.low <= dim.high:
            fail(f"dims[{name!r}]", f"needs 1 <= low <= high, got low={dim.low} high={dim.high}")
        if not isinstance(dim.multiple, int) or dim.multiple < 1 or dim.fit(dim.low) > dim.high:
            fail(f"dims[{name!r}]", f"multiple={dim.multiple!r} leaves no size in [{dim.low}, {dim.high}]")
        odd = [size for size in dim.special if size % dim.multiple]
        if odd:
            fail(f"dims[{name!r}]", f"special sizes {odd} are not multiples of {dim.multiple}")
        if not isinstance(dim.split, int) or isinstance(dim.split, bool) or dim.split < 1:
            fail(f"dims[{name!r}]", f"split={dim.split!r} must be an int >= 1 (how many sizes it may split into)")
        if dim.split > 1 and (dim.low != 1 or dim.multiple != 1):
            fail(f"dims[{name!r}]", f"a split dim takes low=1 and multiple=1 (each of its sizes is any size >= 1), "
                                    f"got low={dim.low} multiple={dim.multiple}")
        if dim.per_row and (dim.split < 2 or dim.programs):
            fail(f"dims[{name!r}]", f"per_row needs split >= 2 (rows, then columns) and no programs, got "
                                    f"split={dim.split!r} programs={dim.programs!r}")
        if not isinstance(dim.programs, (bool, str)):
            fail(f"dims[{name!r}]", f"programs must be True, False or what a program is called, got {dim.programs!r}")
    for name, dim in op.dims.items():
        for relation in ("multiple_of", "at_least"):
            other = getattr(dim, relation)
            if other is not None and (other not in op.dims or other == name):
                fail(f"dims[{name!r}]", f"{relation}={other!r} must name another dim ({', '.join(op.dims)})")
    if sum(bool(dim.programs) for dim in op.dims.values()) > 1:
        fail("dims", "at most one Dim counts programs")


def _validate_params(op, fail) -> None:
    if not isinstance(op.params, dict):
        fail("params", f"must be a dict of name -> a value, Choice(...) or Fixed(...), got {type(op.params).__name__}")
    for name, value in op.params.items():
        if not isinstance(name, str) or name in op.inputs or not name.isidentifier():
            fail(f"params[{name!r}]", "must be an identifier that is not also an input")
        if isinstance(value, Choice) and not value.values:
            fail(f"params[{name!r}]", "Choice() needs at least one value to draw")
        if isinstance(value, Choice) and not isinstance(value.passed, bool):
            fail(f"params[{name!r}]", f"Choice's passed must be True or False, got {value.passed!r}")
        if isinstance(value, tuple) and len(value) < 2:
            fail(f"params[{name!r}]", f"the bare tuple {value!r} is ambiguous (a bare tuple reads as a choice "
                                      f"among its values): write Fixed({value!r}) to pass the tuple itself, or "
                                      f"Choice(...) to draw one of several values")
        if isinstance(value, PerVariant) and isinstance(op.variants, dict) and set(value.values) != set(op.variants):
            fail(f"params[{name!r}]", f"PerVariant must give every variant ({', '.join(op.variants)}), got "
                                      f"{', '.join(value.values) or 'none'}")


def _validate_names(op, fail) -> None:
    for field_name in _NAME_TUPLES:
        value = getattr(op, field_name)
        if value is not None or field_name != "differentiable":
            _names(field_name, value, "input names" if field_name in ("differentiable", "may_clobber") else
                   "output names" if field_name == "outputs" else field_name.replace("_", " "), fail)
    floating = {n for n, t in op.inputs.items() if t.floating}
    for name in op.grads:
        if name not in floating:
            fail("differentiable", f"{name!r} is not a floating input ({', '.join(sorted(floating))})")
    if not op.outputs or len(set(op.outputs)) != len(op.outputs):
        fail("outputs", f"must be distinct names, got {tuple(op.outputs)!r}")
    for name in op.may_clobber:
        if name not in op.inputs:
            fail("may_clobber", f"{name!r} is not an input")
    _validate_exact(op, fail)
    if not isinstance(op.writes_into, dict):
        fail("writes_into", f"must be a dict of output -> input, got {type(op.writes_into).__name__}")
    for output, buffer in op.writes_into.items():
        if output not in op.outputs or buffer not in op.may_clobber:
            fail("writes_into", f"{output!r} -> {buffer!r} needs an output and an input in may_clobber")
    stray = set(op.dtypes) - set(FLOAT_DTYPES)
    if stray or not op.dtypes:
        fail("dtypes", f"must be some of {', '.join(FLOAT_DTYPES)}, got {tuple(op.dtypes)!r}")
    stray = set(op.value_kinds) - set(VALUE_KINDS)
    if stray or not op.value_kinds:
        fail("value_kinds", f"must be some of {', '.join(VALUE_KINDS)}, got {tuple(op.value_kinds)!r}")
    stray = set(op.grad_kinds) - set(GRAD_KINDS)
    if stray or not op.grad_kinds:
        fail("grad_kinds", f"must be some of {', '.join(GRAD_KINDS)}, got {tuple(op.grad_kinds)!r}")


def _validate_exact(op, fail) -> None:
    """A tuple of compared tensors (bit for bit), or a dict of them -> "bits" or "rounding"."""
    problem = form_problem(op.exact, allow_all=False)
    if problem is not None:
        contracts = " or ".join(map(repr, CONTRACTS))
        fail("exact", f"must be a tuple of compared tensor names or a dict of name -> {contracts}, got "
                      f"{op.exact!r}: {problem}")
    compared = (*op.outputs, *(f"d{name}" for name in op.grads))
    for name in op.exact:
        if name not in compared:
            fail("exact", f"{name!r} is not a compared tensor ({', '.join(compared)})")


def _validate_variants(op, fail) -> None:
    for variant, fixed in op.variants.items():
        if not isinstance(fixed, dict):
            fail(f"variants[{variant!r}]", f"must be a dict of param -> its value, got {fixed!r}")
        stray = set(fixed) - set(op.params)
        if stray:
            fail(f"variants[{variant!r}]", f"fixes {sorted(stray)}, which are not params")
        for name, value in fixed.items():
            if isinstance(value, Choice):
                fail(f"variants[{variant!r}][{name!r}]", f"a variant fixes one value (passed as it is), got {value!r}")


def _validate_grid(op, grid: str, fail) -> None:
    entries = getattr(op, grid)
    if isinstance(entries, dict):
        fail(grid, f"must be a tuple of dicts (one per point of the grid), got one dict; write ({entries!r},)")
    if not isinstance(entries, (tuple, list)):
        fail(grid, f"must be a tuple of dicts of dim -> size, got {type(entries).__name__} {entries!r}")
    points = [isinstance(entry, dict) and "dims" in entry for entry in entries]
    if any(points) and not all(points):
        fail(grid, "either every entry is a point (a dict with 'dims') or none is")
    for entry in entries:
        sizes = entry.get("dims") if isinstance(entry, dict) and "dims" in entry else entry
        if isinstance(entry, dict) and "dims" in entry:
            _validate_point(op, grid, entry, fail)
        _validate_sizes(op, grid, sizes, fail)
    if grid == "scale" and entries and op.programs_dim is None and not any(d.per_row for d in op.dims.values()):
        fail("scale", "a scale grid needs a Dim with programs=True to judge it on a slice")


_POINT_KEYS = ("dims", "layout", "values", "params", "grad_layout", "grad_values", "dtypes", "variants")


def _validate_point(op, grid: str, point: dict, fail) -> None:
    stray = set(point) - set(_POINT_KEYS)
    if stray:
        fail(grid, f"a point's keys are some of {', '.join(_POINT_KEYS)}, got {sorted(stray)} in {point!r}")
    _validate_case_fields(op, grid, point, fail)
    if "dtypes" in point and not set(point["dtypes"]) <= set(op.dtypes):
        fail(grid, f"a point's dtypes must be some of the op's ({', '.join(op.dtypes)}), got {point['dtypes']!r}")
    if "variants" in point and not set(point["variants"]) <= set(op.variants):
        fail(grid, f"a point's variants must be some of the op's ({', '.join(op.variants)}), got {point['variants']!r}")


def _validate_case_fields(op, where: str, given: dict, fail) -> None:
    """The fields a point or a pinned case shares with a Case."""
    for key, allowed in (("layout", LAYOUTS), ("grad_layout", GRAD_LAYOUTS), ("values", VALUE_KINDS),
                         ("grad_values", GRAD_KINDS),
                         ("variant", tuple(op.variants)), ("dtype", op.dtypes)):
        if key in given and given[key] not in allowed:
            fail(where, f"{key} must be one of {', '.join(allowed)}, got {given[key]!r}")
    recorded = set(params_of(op, next(iter(op.variants)), lambda name, choices: choices[0])) | _read_by_values(op)
    stray = set(given.get("params", {})) - recorded
    if stray:
        fail(where, f"params names {sorted(stray)}, which the case does not record ({', '.join(sorted(recorded))})")


def _read_by_values(op) -> set[str]:
    """Params a case may record for its tensors' values alone (Positions' whole_first_row)."""
    kinds = [k for t in op.inputs.values() if isinstance(t, Tensor)
             for k in (t.values.values.values() if isinstance(t.values, PerVariant) else (t.values,))]
    return {k.whole_first_row for k in kinds if isinstance(k, Positions) and k.whole_first_row is not None}


def _validate_sizes(op, grid: str, sizes, fail) -> None:
    if not isinstance(sizes, dict) or set(sizes) != set(op.dims):
        fail(grid, f"each entry must give every dim ({', '.join(op.dims)}), got {sizes!r}")
    bad = {d: size for d, size in sizes.items() if not _is_size(op.dims[d], size)}
    if bad:
        fail(grid, f"sizes must be positive ints, each a multiple of its Dim's multiple (a split dim's, a list of "
                   f"1 to split of them); got {bad} in {sizes!r}")


def _is_size(dim: Dim, size) -> bool:
    if dim.split > 1:
        least = 2 if dim.per_row else 1  # a per-row dim: rows, then columns
        return isinstance(size, list) and least <= len(size) <= dim.split and all(_is_size(Dim(), s) for s in size)
    return isinstance(size, int) and not isinstance(size, bool) and size >= 1 and size % dim.multiple == 0


def _validate_noise(op, fail) -> None:
    compared = {*op.outputs, *("d" + n for n in op.grads)}
    for field_name in ("noise", "order_noise", "summed"):
        rules = getattr(op, field_name)
        if not isinstance(rules, dict):
            fail(field_name, f"must be a dict of compared tensor -> noise rule, got {type(rules).__name__}")
        stray = set(rules) - compared
        if stray:
            fail(field_name, f"names {sorted(stray)}, which are not compared tensors")
    if op.noise and set(op.noise) != compared:
        fail("noise", f"a hand-written model covers every compared tensor ({', '.join(sorted(compared))}), got "
                      f"{', '.join(sorted(op.noise))}")
    if op.hf is not None and not callable(op.hf):
        fail("hf", f"must be callable or None, got {type(op.hf).__name__}")
    if op.reordered is not None and not callable(op.reordered):
        fail("reordered", f"must be callable or None, got {type(op.reordered).__name__}")
    if not callable(op.error_inputs) and not isinstance(op.error_inputs, (tuple, list)):
        fail("error_inputs", f"must be a tuple of ErrorInput or a callable, got {type(op.error_inputs).__name__}")


_CASE_KEYS = ("variant", "dtype", "dims", "layout", "values", "params", "seed", "grad_layout", "grad_values")


def _validate_cases(op, field_name: str, fail) -> None:
    entries = getattr(op, field_name)
    if not isinstance(entries, (tuple, list)) or not all(isinstance(e, dict) for e in entries):
        fail(field_name, f"must be a tuple of dicts (one per case), got {entries!r}")
    keys = tuple(k for k in _CASE_KEYS if not (field_name == "float64_cases" and k == "dtype"))
    for entry in entries:
        stray = set(entry) - set(keys)
        if stray or "dims" not in entry:
            fail(field_name, f"each case gives dims and any of {', '.join(k for k in keys if k != 'dims')}, got "
                             f"{entry!r}")
        _validate_sizes(op, field_name, entry["dims"], fail)
        _validate_case_fields(op, field_name, entry, fail)
