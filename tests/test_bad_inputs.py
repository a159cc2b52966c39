"""Bad input never gets a wrong answer from the kernels: the spec table of error inputs.

Every ``ErrorInput`` of every spec (oracle/specs.py) is run against the kernels (this file tests the
kernels themselves, whatever ``--impl`` says): an entry that expects an error must raise it, with its
message, before any kernel launch; an entry that expects HF's result must return it, judged by the
oracle's verdict. Then what no table row can express: position ids rewritten behind autograd's back
between two calls, and the opt-in in-place backward of RMSNorm handed a gradient that aliases X.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import torch

import kernels
from oracle import reference as R
from oracle.compare import judge
from oracle.ops import SPECS
from tests.test_kernels import no_launch, refuse_launches  # noqa: F401  (no_launch: a fixture)

@pytest.fixture(autouse=True)
def positions_checked_on_the_host(monkeypatch):
    """On a GPU, RoPE's kernel checks the positions' range and a device-side assertion on its flag
    follows (kernels/rope.py, Note [The range check in the kernel]), which would end this process's
    CUDA context. Here the flag is read to the host and raises the assertion's message;
    test_a_position_outside_the_table_stops_the_gpu_stream runs the real assertion."""
    def read_on_the_host(inside, message):
        if not bool(inside):
            raise ValueError(message)

    monkeypatch.setattr(sys.modules["kernels.rope"], "_assert_on_device", read_on_the_host)


TABLE = [(spec.name, entry) for spec in SPECS.values() for entry in spec.error_inputs()]
RAISES = [(op, entry) for op, entry in TABLE if entry.expect == "raises"]
SAME_AS_HF = [(op, entry) for op, entry in TABLE if entry.expect == "hf"]


def _ids(rows):
    return [f"{op}: {entry.description}" for op, entry in rows]


def table_counts() -> dict[str, Counter]:
    """Per op, how many entries expect an error and how many expect HF's result."""
    counts: dict[str, Counter] = {}
    for op, entry in TABLE:
        counts.setdefault(op, Counter())[entry.expect] += 1
    return counts


def test_the_table_holds_at_least_50_bad_inputs_of_both_kinds():
    counts = table_counts()
    for op, count in counts.items():
        print(f"{op:28s} {sum(count.values()):3d} entries: {count['raises']:3d} raise, {count['hf']:3d} same as HF")
    assert len(TABLE) >= 50
    assert set(counts) == set(SPECS)
    assert all(count["raises"] and count["hf"] for count in counts.values()), counts
    descriptions = Counter(_ids(TABLE))
    assert not [d for d, n in descriptions.items() if n > 1], "each entry needs its own description"


@pytest.mark.parametrize("op, entry", RAISES, ids=_ids(RAISES))
def test_bad_input_raises_before_any_launch(op, entry, device, monkeypatch):
    if not (entry.in_kernel_on_gpu and device.type == "cuda"):  # there, the kernel that reads it checks it
        refuse_launches(monkeypatch)
    args = entry.args(device)
    with pytest.raises(entry.error, match=entry.match):
        SPECS[op].call(getattr(kernels, op), args)


def _copy(value):
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


@pytest.mark.parametrize("op, entry", SAME_AS_HF, ids=_ids(SAME_AS_HF))
def test_unusual_input_gives_hfs_result(op, entry, device):
    spec = SPECS[op]
    torch.manual_seed(0)  # entries that draw values without a generator draw the same ones every run
    args = entry.args(device)
    for_hf = {name: _copy(value) for name, value in args.items()}  # before the kernels overwrite anything
    hf = spec.call(spec.reference, for_hf)
    truth = spec.call(functools.partial(R.truth, spec.reference), for_hf)
    got = spec.call(getattr(kernels, op), args)
    for name, k, h, t in zip(spec.outputs, got, hf, truth):
        assert (k.shape, k.dtype) == (h.shape, h.dtype), f"{name}: {k.shape} {k.dtype}, HF {h.shape} {h.dtype}"
        if k.numel():
            # judged as the generic suite judges: with the spec's noise model of HF's rounding
            verdict = judge(name, k, h, t, element_noise=spec.noise[name](for_hf, {}))
            assert verdict.passed, f"{name}: {verdict.reason}"


# --- position ids rewritten where no version counter sees it --------------------------------------


def _rope_args(device):
    gen = torch.Generator().manual_seed(0)
    Q, K = torch.randn(1, 4, 3, 8, generator=gen).to(device), torch.randn(1, 2, 3, 8, generator=gen).to(device)
    cos, sin = torch.randn(16, 8, generator=gen).to(device), torch.randn(16, 8, generator=gen).to(device)
    return Q, K, cos, sin, torch.tensor([[0, 1, 2]], device=device)


def _through_data(positions, value):
    positions.data[0, 1] = value


def _through_numpy(positions, value):
    positions.numpy()[0, 1] = value


def _through_dlpack(positions, value):
    torch.from_dlpack(positions)[0, 1] = value


WRITERS = {"data": _through_data, "numpy": _through_numpy, "dlpack": _through_dlpack}


@pytest.mark.parametrize("how", WRITERS)
@pytest.mark.parametrize("value", [16, -1])
def test_position_written_behind_autograds_back_is_caught(how, value, device, monkeypatch):
    if how == "numpy" and device.type != "cpu":
        pytest.skip("numpy views only CPU memory")
    Q, K, cos, sin, positions = _rope_args(device)
    kernels.rope(Q, K, cos, sin, positions)  # in range: rotates
    version = positions._version
    WRITERS[how](positions, value)
    assert positions._version == version  # invisible to autograd: a remembered verdict would be stale
    if device.type == "cpu":  # on a GPU the rotation kernel itself checks
        refuse_launches(monkeypatch)
    with pytest.raises(ValueError, match="outside the table"):
        kernels.rope(Q, K, cos, sin, positions)


def test_position_written_between_forward_and_backward_is_caught(device):
    Q, K, cos, sin, positions = _rope_args(device)
    Q0 = Q.requires_grad_()
    Q_out, _ = kernels.rope(Q0.clone(), K, cos, sin, positions)
    _through_data(positions, 99)
    with pytest.raises(ValueError, match="outside the table"):
        Q_out.sum().backward()


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_the_kernel_flags_exactly_the_positions_outside_the_table_and_writes_none_of_their_tokens(dtype, device):
    """The GPU's check, on every device: the rotation kernel launched directly (past the CPU's check
    before the launch) clears its flag exactly when a position is outside the table's 16 rows,
    rotates the other tokens as HF does, and leaves the outside tokens' rows unwritten."""
    rope = sys.modules["kernels.rope"]
    gen = torch.Generator().manual_seed(0)
    Q, K = torch.randn(1, 4, 3, 8, generator=gen).to(device), torch.randn(1, 2, 3, 8, generator=gen).to(device)
    cos, sin = torch.randn(16, 8, generator=gen).to(device), torch.randn(16, 8, generator=gen).to(device)
    for row in [[0, 15, 3], [3, 3, 3], [-1, 2, 0], [16, 0, 1], [0, 2**30, 1], [-(2**30), 1, 2], [15, 16, 0]]:
        positions = torch.tensor([row], dtype=dtype, device=device)
        flags = []
        Q_out, K_out = torch.full_like(Q, 7.0), torch.full_like(K, 7.0)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(rope, "_assert_on_device", lambda inside, message: flags.append(int(inside)))
            rope._launch(Q, Q_out, K, K_out, cos, sin, positions, backward=False)
        inside = [0 <= p < 16 for p in row]
        assert flags == [int(all(inside))], row
        in_range = [t for t, ok in enumerate(inside) if ok]
        Q_hf, K_hf = SPECS["rope"].reference(Q[:, :, in_range].clone(), K[:, :, in_range].clone(), cos, sin,
                                             positions[:, in_range])
        assert torch.equal(Q_out[:, :, in_range], Q_hf) and torch.equal(K_out[:, :, in_range], K_hf), row
        outside = [t for t, ok in enumerate(inside) if not ok]
        assert bool((Q_out[:, :, outside] == 7).all()) and bool((K_out[:, :, outside] == 7).all()), row


_STOPPED_BY_THE_DEVICE = textwrap.dedent("""
    import sys, torch, kernels
    Q, K = torch.randn(1, 4, 3, 8, device="cuda"), torch.randn(1, 2, 3, 8, device="cuda")
    cos, sin = torch.randn(16, 8, device="cuda"), torch.randn(16, 8, device="cuda")
    positions = torch.tensor([[0, 1, int(sys.argv[1])]], device="cuda")
    kernels.rope(Q, K, cos, sin, positions)
    torch.cuda.synchronize()
    print("no assertion")
""")


@pytest.mark.parametrize("position", [2, 16])
def test_a_position_outside_the_table_stops_the_gpu_stream(position, device):
    """The real device-side assertion, in a process of its own: position 16 of a 16-row table stops
    the program at the next synchronisation; position 2, inside, runs to the end."""
    if device.type != "cuda":
        pytest.skip("a device-side assertion needs a GPU; on the CPU the check raises ValueError (tested above)")
    proc = subprocess.run([sys.executable, "-c", _STOPPED_BY_THE_DEVICE, str(position)], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).resolve().parent.parent)
    if position < 16:
        assert proc.returncode == 0 and "no assertion" in proc.stdout, proc.stderr[-2000:]
    else:
        assert proc.returncode != 0 and "no assertion" not in proc.stdout
        assert "device-side assert" in proc.stderr, proc.stderr[-2000:]


# --- what a table row cannot express ----------------------------------------------------------------


def test_flags_must_be_bools(device, no_launch):  # noqa: F811
    X, W = torch.randn(2, 4, device=device), torch.randn(4, device=device)
    with pytest.raises(TypeError, match="write_dx_into_dy must be a bool"):
        kernels.rms_norm(X, W, 1e-6, write_dx_into_dy="no")


def test_in_place_backward_never_writes_into_a_gradient_that_aliases_X(device):
    """write_dx_into_dy with dY sharing X's memory: writing dX there would overwrite the caller's X."""
    gen = torch.Generator().manual_seed(1)
    X = torch.randn(6, 70, generator=gen).to(device).requires_grad_()
    W = torch.randn(70, generator=gen).to(device).requires_grad_()
    X_before = X.detach().clone()
    safe = torch.autograd.grad(kernels.rms_norm(X, W, 1e-6), (X, W), X_before)
    aliased = torch.autograd.grad(kernels.rms_norm(X, W, 1e-6, write_dx_into_dy=True), (X, W), X.detach())
    assert torch.equal(X.detach(), X_before)
    assert torch.equal(aliased[0], safe[0]) and torch.equal(aliased[1], safe[1])
