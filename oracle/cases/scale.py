"""Cases at production scale: when a case is one, which of its programs are compared, and one such
case at a time per GPU.

Note [Judging a case at scale]
    Up to AT_SCALE_ELEMENTS elements per tensor a case is judged whole, as everywhere else. Past it
    (the scale grid's cases hold up to 2^31 + a row of elements, where the float64 truth of one
    tensor alone is 17 GB) the implementation still runs on the whole case, in the case's layout,
    with every guard and snapshot, but HF's maths, the truth and the noise model are evaluated on a
    slice of its programs (RMSNorm's rows, RoPE's tokens, SwiGLU's rows: see ``specs.Programs``),
    and the implementation's outputs and gradients are judged on the same slice. Each program
    depends on its own inputs only, so the slice's truth is the whole case's truth there.
    ``compared_programs`` picks the slice: the first and last programs, those around every power of
    two from 4096 up (tiles, program groups, CUDA's 65535 grid limit), those around the element
    offsets 2^31 and 2^32 of the largest tensor (where 32-bit offsets wrap), and seeded random
    ones, SLICE_ELEMENTS elements in all.

    Gradients summed over every program (RMSNorm's dW) cannot be sliced: they are judged whole.
    HF's value is HF's autograd over the whole case (its own order of the sum), the truth is summed
    in float64 chunk by chunk, and their noise models take the whole case in bounded memory (the
    spec says which: ``Programs.summed_gradients``).

    Values at this scale are drawn by the device's generator (specs.fill): the same numbers on every
    run on that kind of device, not the CPU's numbers.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import math
import tempfile
from pathlib import Path

import torch

from oracle.cases import Case

AT_SCALE_ELEMENTS = 2**26  # past it, a tensor is made on the device and its case judged on a slice
EXCLUSIVE_ELEMENTS = 2**24  # past it, a case has its GPU to itself (one_at_a_time)
SLICE_ELEMENTS = 2**24  # the slice's size, in elements of the case's largest tensor
NEAR = 4  # programs taken on each side of a boundary
FIRST_BOUNDARY = 2**12


def largest_tensor(spec, case: Case) -> int:
    """Elements of the case's largest tensor (0 for an op without a ``programs`` entry)."""
    return spec.programs.size(case)[1] if spec.programs else 0


def judged_on_a_slice(spec, case: Case) -> bool:
    return largest_tensor(spec, case) > AT_SCALE_ELEMENTS


def needs_the_gpu_alone(spec, case: Case) -> bool:
    """Cases at scale, and those judged whole just below it (up to 2^26 elements, a float64 truth of
    several GB per tensor): two of them, or one beside a dozen pytest workers, can exhaust a GPU."""
    return largest_tensor(spec, case) > EXCLUSIVE_ELEMENTS


def compared_programs(count: int, per_program: int, seed: int) -> torch.Tensor:
    """The programs a case at scale is judged on (Note [Judging a case at scale]), sorted."""
    budget = max(2 * NEAR, SLICE_ELEMENTS // max(1, per_program))
    if count <= budget:
        return torch.arange(count)
    picks: set[int] = set()

    def around(program: int) -> None:
        picks.update(range(max(0, program - NEAR), min(count, program + NEAR)))

    around(NEAR)
    around(count - NEAR)
    boundary = FIRST_BOUNDARY
    while boundary < count:
        around(boundary)
        boundary *= 2
    for offset in (2**31, 2**32):  # the program holding that element of the largest tensor
        if offset < count * per_program:
            around(offset // per_program)
    room = budget - len(picks)
    if room > 0:
        order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
        chosen = torch.tensor(sorted(picks))
        order = order[~torch.isin(order, chosen)]
        picks.update(order[:room].tolist())
    return torch.tensor(sorted(picks))


def chunks(count: int, per_program: int):
    """Ranges of programs of about SLICE_ELEMENTS elements each, covering all ``count``."""
    step = max(1, SLICE_ELEMENTS // max(1, per_program))
    for start in range(0, count, step):
        yield torch.arange(start, min(count, start + step))


def describe_slice(spec, compared: int, count: int) -> str:
    whole = spec.programs.summed_gradients
    summed = f"; {', '.join(whole)} over all of them" if whole else ""
    return (f"judged on {compared} of {count} {spec.programs.unit} (first, last, around powers of two and the "
            f"2^31-element offset, and random ones){summed}")


@contextlib.contextmanager
def one_at_a_time(spec, case: Case, device):
    """Around a large case on a GPU (needs_the_gpu_alone): hold that GPU's lock (a file lock, so that
    pytest-xdist workers and report workers on one GPU queue up), and hand the memory back to the
    driver afterwards for the next process."""
    device = torch.device(device)
    if device.type != "cuda" or not needs_the_gpu_alone(spec, case):
        yield
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    path = Path(tempfile.gettempdir()) / f"kernel-oracle-scale-cuda{index}.lock"
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            gc.collect()
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            fcntl.flock(lock, fcntl.LOCK_UN)


def rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The rows ``index`` of a (..., n) tensor, leading dims flattened: (len(index), n)."""
    return t.reshape(-1, t.shape[-1])[index.to(t.device)]


def row_count(shape) -> int:
    return math.prod(shape[:-1]) if len(shape) else 1
