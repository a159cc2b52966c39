"""Bad input never gets a wrong answer from the kernels: the spec table of error inputs.

Every ``ErrorInput`` of every spec (oracle/declare/spec.py) is run against the kernels (this file tests the
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
from oracle.declare import reference as R
from oracle.verdict import Noise, judge
from oracle.declare.registry import SPECS
from tests.test_kernels import no_launch, refuse_launches  # noqa: F401  (no_launch: a fixture)

def in_a_process_of_its_own(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` on the GPU in a fresh process, then synchronise: on a GPU RoPE's kernel checks the
    positions' range with a device-side assertion (kernels/rope.py, Note [The range check in the
    kernel]), which ends the CUDA context of the process it fires in, and this one (an xdist worker)
    has more tests to run."""
    script = "import torch\n" + textwrap.dedent(code) + "\ntorch.cuda.synchronize()\nprint('no assertion')\n"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parent.parent)


def assert_stopped_by_the_kernel(proc: subprocess.CompletedProcess) -> None:
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "no assertion" not in proc.stdout, output[-2000:]
    assert "device-side assert" in output and "position_ids outside the table" in output, output[-2000:]


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
    if entry.in_kernel_on_gpu and device.type == "cuda":  # there, the kernel that reads it checks it
        assert_stopped_by_the_kernel(in_a_process_of_its_own(f"""
            import kernels
            from oracle.declare.registry import SPECS
            spec = SPECS[{op!r}]
            entry = next(e for e in spec.error_inputs() if e.description == {entry.description!r})
            spec.call(getattr(kernels, {op!r}), entry.args(torch.device("cuda")))"""))
        return
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
            verdict = judge(name, k, h, t, noise=Noise(element_noise=spec.noise[name](for_hf, {})))
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
    if device.type == "cuda":  # the rotation kernel itself checks
        proc = in_a_process_of_its_own(f"""
            import kernels
            from tests.test_bad_inputs import WRITERS, _rope_args
            Q, K, cos, sin, positions = _rope_args(torch.device("cuda"))
            kernels.rope(Q, K, cos, sin, positions)
            torch.cuda.synchronize()
            print("in range: rotated", flush=True)
            WRITERS[{how!r}](positions, {value})
            kernels.rope(Q, K, cos, sin, positions)""")
        assert "in range: rotated" in proc.stdout, proc.stderr[-2000:]
        assert_stopped_by_the_kernel(proc)
        return
    Q, K, cos, sin, positions = _rope_args(device)
    kernels.rope(Q, K, cos, sin, positions)  # in range: rotates
    version = positions._version
    WRITERS[how](positions, value)
    assert positions._version == version  # invisible to autograd: a remembered verdict would be stale
    refuse_launches(monkeypatch)
    with pytest.raises(ValueError, match="outside the table"):
        kernels.rope(Q, K, cos, sin, positions)


def test_position_written_between_forward_and_backward_is_caught(device):
    if device.type == "cuda":
        proc = in_a_process_of_its_own("""
            import kernels
            from tests.test_bad_inputs import _rope_args, _through_data
            Q, K, cos, sin, positions = _rope_args(torch.device("cuda"))
            Q_out, _ = kernels.rope(Q.requires_grad_().clone(), K, cos, sin, positions)
            torch.cuda.synchronize()
            print("forward: rotated", flush=True)
            _through_data(positions, 99)
            Q_out.sum().backward()""")
        assert "forward: rotated" in proc.stdout, proc.stderr[-2000:]
        assert_stopped_by_the_kernel(proc)
        return
    Q, K, cos, sin, positions = _rope_args(device)
    Q0 = Q.requires_grad_()
    Q_out, _ = kernels.rope(Q0.clone(), K, cos, sin, positions)
    _through_data(positions, 99)
    with pytest.raises(ValueError, match="outside the table"):
        Q_out.sum().backward()


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_the_kernel_reads_and_writes_none_of_the_tokens_outside_the_table(dtype, device):
    """What the GPU's kernel does beside its assertion, on every device: launched directly (past the
    CPU's check before the launch) and compiled without the assertion, the rotation kernel rotates
    the tokens inside the table's 16 rows as HF does and leaves the outside tokens' rows unwritten
    (their table row read is row 0's, never one past the table)."""
    rope = sys.modules["kernels.rope"]
    gen = torch.Generator().manual_seed(0)
    Q, K = torch.randn(1, 4, 3, 8, generator=gen).to(device), torch.randn(1, 2, 3, 8, generator=gen).to(device)
    cos, sin = torch.randn(16, 8, generator=gen).to(device), torch.randn(16, 8, generator=gen).to(device)
    for row in [[0, 15, 3], [3, 3, 3], [-1, 2, 0], [16, 0, 1], [0, 2**30, 1], [-(2**30), 1, 2], [15, 16, 0]]:
        positions = torch.tensor([row], dtype=dtype, device=device)
        Q_out, K_out = torch.full_like(Q, 7.0), torch.full_like(K, 7.0)
        with rope.without_range_assertion():
            rope._launch(Q, Q_out, K, K_out, cos, sin, positions, backward=False)
        inside = [0 <= p < 16 for p in row]
        in_range = [t for t, ok in enumerate(inside) if ok]
        Q_hf, K_hf = SPECS["rope"].reference(Q[:, :, in_range].clone(), K[:, :, in_range].clone(), cos, sin,
                                             positions[:, in_range])
        assert torch.equal(Q_out[:, :, in_range], Q_hf) and torch.equal(K_out[:, :, in_range], K_hf), row
        outside = [t for t, ok in enumerate(inside) if not ok]
        assert bool((Q_out[:, :, outside] == 7).all()) and bool((K_out[:, :, outside] == 7).all()), row


@pytest.mark.parametrize("row", [[0, 15, 3], [15, 16, 0]], ids=["inside", "one past the end"])
def test_the_kernel_asserts_exactly_when_a_position_is_outside_the_table(row, device):
    """The real device-side assertion, in a process of its own: a 16-row table's first and last rows
    run to the end; row 16, beside row 15, stops the stream at the next synchronisation. (The table's
    negative, int32 and far-out positions assert in test_bad_input_raises_before_any_launch.)"""
    if device.type != "cuda":
        pytest.skip("a device-side assertion needs a GPU; on the CPU the check raises ValueError (tested above)")
    proc = in_a_process_of_its_own(f"""
        import kernels
        Q, K = torch.randn(1, 4, 3, 8, device="cuda"), torch.randn(1, 2, 3, 8, device="cuda")
        cos, sin = torch.randn(16, 8, device="cuda"), torch.randn(16, 8, device="cuda")
        kernels.rope(Q, K, cos, sin, torch.tensor([{row}], device="cuda"))""")
    if max(row) < 16:
        assert proc.returncode == 0 and "no assertion" in proc.stdout, proc.stderr[-2000:]
    else:
        assert_stopped_by_the_kernel(proc)


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
