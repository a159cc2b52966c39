"""Every launch path of the kernels, forced at small shapes so each runs on CPU too: RMSNorm's
row-block, looped and split paths under the oracle's verdict, the measured launch table they are
chosen from, and RoPE's single-launch backward through the autograd node that records Q and K."""

from __future__ import annotations

import importlib
import importlib.util
import json

import pytest
import torch

import kernels
from kernels import _launch, _layout
from kernels import _rms_norm_configs as configs
from kernels._rms_norm_configs import Config
from oracle.cases import Case
from oracle.engine import run_case
from oracle.declare.implementations import load
from oracle.ops.rope import apply_rotary_pos_emb, rotary_table
from tests.one_thread import one_torch_thread  # noqa: F401 (autouse: one torch thread per test)

rms_module = importlib.import_module("kernels.rms_norm")
rope_module = importlib.import_module("kernels.rope")

# Chunks of 64 columns over 200: three full steps and a tail; rows per step that leave a tail too.
# 3 x 5 = 15 rows: the looped forward's 4 persistent programs sweep 2 row groups each (the last one
# short), each of the split backward's 3 programs a full step of 4 rows and a tail, the row blocks a
# tail of 3; as many paths as at 35 rows and 300 columns, at half the interpreter's steps.
PATHS = {
    "rows x4": (Config("rows", 4, rows=4), Config("rows", 4, rows=8, programs_per_sm=2, stages=3)),  # pipelined
    "looped / split": (Config("looped", 4, rows=2, chunk=64, programs_per_sm=1, stages=3),
                       Config("split", 4, rows=4, chunk=64, programs_per_sm=3)),
    # 4 programs share each row (64 x 4 >= 200 columns), 1 row group at a time per 4 slots
    "parts / rows": (Config("parts", 4, chunk=64, programs_per_sm=1), Config("rows", 4, rows=4)),
    # 4 persistent programs of 4, 4, 4 and 3 rows: a first sweep alone, fused steps, a last sweep alone
    "overlapped / rows": (Config("overlapped", 4, chunk=64, programs_per_sm=1), Config("rows", 4, rows=4)),
}


def _forcing(monkeypatch, forward: Config, backward: Config) -> None:
    chosen = {"forward": forward, "backward": backward}
    monkeypatch.setattr(rms_module, "lookup", lambda pass_name, *_: chosen[pass_name])


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("variant", ["llama", "gemma"])
@pytest.mark.parametrize("path", list(PATHS))
def test_every_rms_norm_path_passes_the_verdict(path, variant, dtype, layout, device, monkeypatch):
    _forcing(monkeypatch, *PATHS[path])
    case = Case("rms_norm", variant, dtype, {"lead": [3, 5], "cols": 200}, layout, "normal",
                {"eps": 1e-6, "weight": "same"}, seed=4)
    result = run_case("rms_norm", case, load("kernels"), device)
    assert result.passed, result.explain()


def test_a_forced_path_really_runs(device, monkeypatch):
    """The forcing above reaches the launches: the split path launches the row-dot kernel, the
    row-block path does not (so the parametrized test cannot pass by running the default)."""
    launched = []
    original = rms_module._rms_norm_row_dot_kernel

    class Counting:
        def __getitem__(self, grid):
            launched.append(grid)
            return original[grid]

    monkeypatch.setattr(rms_module, "_rms_norm_row_dot_kernel", Counting())
    X = torch.randn(9, 300, device=device, requires_grad=True)
    W = torch.randn(300, device=device, requires_grad=True)
    for path, expected in (("rows x4", []), ("looped / split", [(9,)])):  # split: every row's sum first
        _forcing(monkeypatch, *PATHS[path])
        launched.clear()
        torch.autograd.grad(kernels.rms_norm(X, W, 1e-6), (X, W), torch.randn(9, 300, device=device))
        assert launched[:1] == expected, path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("gemma", [False, True])
def test_the_parts_forward_gives_the_same_bits_whoever_sums_a_share(dtype, gemma, device, monkeypatch):
    """Note [A row shared by programs]: with PATIENCE 0 every program sums its partners' shares from X
    itself; with patience the later programs read the shares their partners published (Triton's
    interpreter runs the programs in turn, so both happen in one launch there; on a GPU partners mostly
    publish in time). The two give the same Y and 1/rms, bit for bit, as they must for the bits not to
    depend on timing, and the launch does what the row-block forward does within the verdict's bound
    (test_every_rms_norm_path_passes_the_verdict)."""
    X, _, W = _rms_inputs(monkeypatch, device, dtype, rows=11, cols=300, seed=7)
    X[3, 150:] = 0  # a row whose last shares are +0.0
    parts = Config("parts", 4, chunk=128, programs_per_sm=2)  # 3 programs a row, 2 row groups at once
    published = rms_module.forward(X, W, 1e-6, gemma, parts)
    monkeypatch.setattr(rms_module, "PATIENCE", 0)
    summed_alone = rms_module.forward(X, W, 1e-6, gemma, parts)
    for mine, theirs in zip(published, summed_alone):
        assert torch.equal(mine, theirs)
    reference = rms_module.forward(X, W, 1e-6, gemma, Config("rows", 4, rows=1))
    torch.testing.assert_close(published[1], reference[1], rtol=4 * torch.finfo(published[1].dtype).eps, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("gemma", [False, True])
def test_the_overlapped_forward_gives_the_looped_forwards_bits(dtype, gemma, device, monkeypatch):
    """Note [Two rows a step]: fusing a row's second sweep with the next row's first changes when the
    chunks are read, not how they are summed, so at the same chunk and warps the overlapped forward
    writes the looped forward's Y and 1/rms bit for bit: with more rows than programs (fused steps),
    fewer (a first and a last sweep alone), and rows of a transposed X (a row stride of one element)."""
    X, _, W = _rms_inputs(monkeypatch, device, dtype, rows=11, cols=300, seed=3)
    launched = _record_launches(monkeypatch)
    for rows, per_sm in ((X, 1), (X, 2), (X[:3], 2), (X.t().contiguous().t(), 1)):
        launched.clear()
        setting = {"warps": 4, "chunk": 128, "programs_per_sm": per_sm}
        overlapped = rms_module.forward(rows, W, 1e-6, gemma, Config("overlapped", **setting))
        assert launched == [("_rms_norm_forward_overlapped_kernel", (min(len(rows), 4 * per_sm),))]
        looped = rms_module.forward(rows, W, 1e-6, gemma, Config("looped", **setting))
        for mine, theirs in zip(overlapped, looped):
            assert torch.equal(mine, theirs)


def test_the_parts_forward_launches_programs_in_whole_rows(device, monkeypatch):
    """The grid is a multiple of the programs a row takes (a partial group would wait for a partner that
    is never launched), and the words are zeroed before each launch."""
    X, _, W = _rms_inputs(monkeypatch, device, torch.float32, rows=5, cols=300, seed=1)
    grids, words = [], []
    original = rms_module.launch

    def recording(kernel, grid, *args, **kwargs):
        if kernel is rms_module._rms_norm_forward_parts_kernel:
            grids.append((grid, kwargs["PARTS"]))
            words.append(args[-1].clone())
        return original(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(rms_module, "launch", recording)
    for per_sm in (1, 2, 7):
        rms_module.forward(X, W, 1e-6, False, Config("parts", 4, chunk=128, programs_per_sm=per_sm))
    # 4 slots: 4 // 3 = 1 row group, 8 // 3 = 2, 28 // 3 = 9 capped at the 5 rows
    assert grids == [((3,), 3), ((6,), 3), ((15,), 3)]
    assert all(w.shape == (5, 3) and w.dtype == torch.int32 and not w.any() for w in words)


# --- the launch table ------------------------------------------------------------------------------


def test_the_committed_table_holds_the_tuners_choice_at_every_width():
    """The fastest measured setting, or within the tuner's MEMORY_TIE of it the leanest; measured on
    Hopper cards of 132 SMs (the table counts programs per SM)."""
    choose = _tuner().choose
    data = json.loads(configs.CONFIG_FILE.read_text())
    assert data["schema"] == configs.SCHEMA and "provisional" not in data
    gemma = data.get("gemma", {})
    for pass_name in ("forward", "backward"):
        assert all(run["environment"]["device"] in ("NVIDIA H200", "NVIDIA H100 80GB HBM3")
                   for run in data["measured"][pass_name])
        widths = data[pass_name]
        assert sorted(map(int, widths)) == [2**k for k in range(7, 17)]
        assert set(gemma.get(pass_name, {})) <= set(widths)  # Gemma's own entries, at measured widths only
        for width, entry in [*widths.items(), *gemma.get(pass_name, {}).items()]:
            timed = [c for c in entry["candidates"] if "ms" in c]
            assert len(timed) >= 10, (pass_name, width)
            best = choose(timed)
            assert entry["chosen"] == best["config"] and entry["ms"] == best["ms"], (pass_name, width)
            Config.of(entry["chosen"], pass_name)  # a setting the kernels can launch


def test_lookup_scales_rows_for_narrow_blocks_and_shares_short_inputs_out():
    measured = configs.table()["llama"]["forward"][128]
    assert measured.path == "rows"
    wide_enough = 10**9
    assert configs.lookup("forward", 100, wide_enough, 132) == measured  # block 128
    assert configs.lookup("forward", 32, wide_enough, 132).rows == measured.rows * 4  # same elements per program
    assert configs.lookup("forward", 128, 132 * 2, 132).rows == min(measured.rows, 2)  # every SM gets a program
    assert configs.lookup("forward", 128, 5, 132).rows == 1
    widest = configs.table()["llama"]["forward"][65536]
    assert configs.lookup("forward", 65536, 7, 132) == widest  # not a row block: unchanged


def test_gemma_takes_its_own_entry_where_one_was_measured_and_llamas_elsewhere():
    measured = configs.table()
    assert measured["gemma"]["backward"], "the committed table has a Gemma entry"
    for width in (2**k for k in range(7, 17)):
        own = measured["gemma"]["backward"].get(width)
        gemma, llama = (configs.lookup("backward", width, 10**9, 132, gemma=g) for g in (True, False))
        assert llama == measured["llama"]["backward"][width] and gemma == (own or llama)


def _tuner():
    spec = importlib.util.spec_from_file_location("tune_rms_norm", configs.CONFIG_FILE.parents[1] / "scripts" /
                                                  "tune_rms_norm.py")
    tuner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tuner)
    return tuner


def test_the_tuner_merges_a_gemma_measurement_into_its_own_section(tmp_path):
    tuner = _tuner()
    table = tmp_path / "configs.json"
    table.write_text(configs.CONFIG_FILE.read_text())
    chosen = {"path": "split", "warps": 4, "rows": 1, "chunk": 2048, "programs_per_sm": 1, "stages": 1}
    measured = {"environment": {"device": "NVIDIA H200"}, "elements": 2**26, "dtype": "bfloat16", "command": "c",
                "widths": {"8192": {"chosen": chosen, "ms": 0.1, "candidates": [{"config": chosen, "ms": 0.1}]}}}
    gemma = tmp_path / "gemma.json"
    gemma.write_text(json.dumps({"pass": "backward", "variant": "gemma", **measured}))
    tuner.merge([gemma], table)
    merged = json.loads(table.read_text())
    assert merged["gemma"]["backward"]["8192"]["chosen"] == chosen
    assert merged["backward"]["8192"] == json.loads(configs.CONFIG_FILE.read_text())["backward"]["8192"]  # Llama's kept
    assert merged["measured"]["backward"][-1]["variant"] == "gemma"
    table.write_text(json.dumps({**merged, "schema": "kernel-oracle/rms-norm-configs/0"}))
    with pytest.raises(SystemExit, match="schema"):
        tuner.merge([gemma], table)


def test_the_tuner_keeps_the_leaner_setting_within_its_memory_tie_and_the_fastest_beyond_it():
    tuner = _tuner()
    fast = {"config": "fast", "ms": 1.0, "kib": 896.0}
    lean = {"config": "lean", "ms": 1.0 + 0.9 * tuner.MEMORY_TIE, "kib": 132.0}
    failed = {"config": "failed", "error": "OutOfResources: shared memory"}
    assert tuner.choose([fast, lean, failed])["config"] == "lean"
    assert tuner.choose([fast, {**lean, "ms": 1.0 + 1.1 * tuner.MEMORY_TIE}])["config"] == "fast"
    assert tuner.choose([{**lean, "config": "slower"}, {**lean, "ms": 1.0}])["ms"] == 1.0  # equal memory: the faster


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(schema="kernel-oracle/rms-norm-configs/0"), "schema"),
    (lambda d: d["backward"]["128"]["chosen"].update(path="looped"), "backward path must be one of"),
    (lambda d: d["forward"]["128"]["chosen"].update(lanes=3), "lanes"),
])
def test_a_damaged_table_is_refused_by_name(change, message, tmp_path, monkeypatch):
    data = json.loads(configs.CONFIG_FILE.read_text())
    change(data)
    damaged = tmp_path / "configs.json"
    damaged.write_text(json.dumps(data))
    monkeypatch.setattr(configs, "CONFIG_FILE", damaged)
    configs.table.cache_clear()
    try:
        with pytest.raises((ValueError, TypeError), match=message):
            configs.table()
    finally:
        configs.table.cache_clear()


def test_host_arithmetic_matches_triton():
    import triton

    for n in [*range(70), 4095, 4096, 4097, 2**31 - 1, 2**31 + 1]:
        assert _launch.next_power_of_2(n) == triton.next_power_of_2(n), n
        for d in (1, 3, 64, 132):
            assert _launch.cdiv(n, d) == triton.cdiv(n, d), (n, d)


def test_the_contiguous_shortcut_describes_rows_like_the_general_layout():
    for shape in [(7, 5), (2, 3, 4), (1, 1, 9), (4,)]:
        tensors = (torch.empty(shape), torch.empty(shape))
        fast, _ = _layout.rows_addressable(*tensors)
        general = _layout.row_layout(*tensors)
        assert fast.n_rows == general.n_rows
        # the same address for every row, whichever way the leading dims are counted
        for layout in (fast, general):
            assert _row_addresses(layout) == [r * shape[-1] for r in range(layout.n_rows)]
            assert layout.strides[0][3] == 1


def _row_addresses(layout: _layout.RowLayout, tensor: int = 0) -> list[int]:
    """Each row's first element, as _row_offsets computes it from the layout."""
    _, L1, L2 = layout.lead
    s0, s1, s2, _ = layout.strides[tensor]
    return [(r // L2 // L1) * s0 + (r // L2 % L1) * s1 + (r % L2) * s2 for r in range(layout.n_rows)]


def test_absent_leading_groups_are_ones_at_the_end_so_the_kernels_divide_by_constants():
    """Triton compiles an integer argument equal to 1 as a constant: with the absent groups' sizes last,
    a contiguous launch's row address needs no division (L1 = L2 = 1), a transposed pair's one (L2 = 1)."""
    base = torch.arange(4 * 6 * 8).reshape(4, 6, 8)
    pair = base.transpose(0, 1)  # (6, 4, 8): two leading groups that cannot merge
    triple = torch.arange(3 * 4 * 6 * 8).reshape(3, 4, 6, 8).permute(1, 0, 2, 3)[:, :, ::2]  # three
    contiguous = base.reshape(24, 8)
    for tensor, ones in ((contiguous, 2), (base, 2), (pair, 1), (triple, 0)):
        layouts = [_layout.row_layout(tensor)]
        if tensor.is_contiguous():
            layouts.append(_layout.rows_addressable(tensor)[0])
        for layout in layouts:
            assert layout.lead[3 - ones:] == (1,) * ones and 1 not in layout.lead[:3 - ones], (tensor.shape, layout)
            first_elements = tensor.reshape(-1, tensor.shape[-1])[:, 0].tolist()  # the storage index of each row
            assert _row_addresses(layout) == first_elements, (tensor.shape, layout)


# --- dW's partial rows inside dX (Note [dW's partial rows inside dX]) ------------------------------


def _rms_inputs(monkeypatch, device, dtype, rows: int, cols: int, seed: int) -> tuple[torch.Tensor, ...]:
    """X, dY and a W near 1, seeded; launches sized for 4 program slots (the CPU's: the same
    programs on a GPU)."""
    gen = torch.Generator().manual_seed(seed)
    X, dY = (torch.randn(rows, cols, dtype=dtype, generator=gen).to(device) for _ in range(2))
    W = (1 + 0.1 * torch.randn(cols, generator=gen)).to(dtype).to(device)
    monkeypatch.setattr(rms_module, "program_slots", lambda _: 4)
    return X, dY, W


def _record_launches(monkeypatch) -> list[tuple[str, tuple]]:
    """Every launch RMSNorm's module makes from now on, as (kernel name, grid), launched as usual."""
    launched, real_launch = [], rms_module.launch

    def recording(kernel, grid, *args, **kwargs):
        launched.append((kernel.fn.__name__, grid))
        return real_launch(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(rms_module, "launch", recording)
    return launched


def _backward_twice(monkeypatch, device, dtype, rows, cols, backward: Config):
    """RMSNorm's backward with the partials where the kernels put them, and in a buffer of their
    own: (reserved rows chosen, both results)."""
    X, dY, W = _rms_inputs(monkeypatch, device, dtype, rows, cols, seed=rows * cols)
    _, inv_var = rms_module.forward(X, W, 1e-6, True)
    results, chosen = [], []
    real = rms_module._reserved_rows
    for choose in (lambda *args: chosen.append(real(*args)) or chosen[-1], lambda *args: 0):
        monkeypatch.setattr(rms_module, "_reserved_rows", choose)
        dX = torch.full_like(X, float("nan"))
        dW = rms_module.backward(dY, X, W, inv_var, True, dX, True, backward)
        results.append((dX, dW))
    return chosen[0], results


@pytest.mark.parametrize("dtype, cols, reserved", [
    ("bfloat16", 96, 2),  # two rows of bf16 hold a row of fp32
    ("bfloat16", 97, 3),  # odd columns: a row may start mid fp32 element, so one more row
    ("float32", 97, 1),
    ("float64", 40, 1),
])
@pytest.mark.parametrize("backward", [Config("rows", 4, rows=2, programs_per_sm=2),
                                      Config("split", 4, rows=2, chunk=32, programs_per_sm=2)], ids=["rows", "split"])
def test_partials_inside_dx_give_the_same_bits_as_a_buffer_of_their_own(dtype, cols, reserved, backward, device,
                                                                         monkeypatch):
    # 31 rows over 8 programs of 4 rows (3 in the last), or 3 programs per column chunk of 11 (9)
    chosen, ((dX, dW), (dX_own, dW_own)) = _backward_twice(monkeypatch, device, getattr(torch, dtype), 31, cols,
                                                           backward)
    assert chosen == reserved
    assert not dX.isnan().any()  # the reserved rows' dX written after all
    assert torch.equal(dX, dX_own) and torch.equal(dW, dW_own)


@pytest.mark.parametrize("backward", [Config("rows", 4, rows=2, programs_per_sm=2),
                                      Config("split", 4, rows=2, chunk=32, programs_per_sm=2)], ids=["rows", "split"])
def test_a_backward_without_dw_writes_the_same_dx_and_no_partial_rows(backward, device, monkeypatch):
    """A frozen weight (LoRA's norms): no partial rows held, summed or fixed up; dX's bits as with dW."""
    X, dY, W = _rms_inputs(monkeypatch, device, torch.bfloat16, 31, 96, seed=5)
    _, inv_var = rms_module.forward(X, W, 1e-6, False)
    launched = _record_launches(monkeypatch)
    dX_with, dX_without = torch.empty_like(X), torch.empty_like(X)
    assert rms_module.backward(dY, X, W, inv_var, False, dX_with, True, backward) is not None
    assert len(launched) == 3 + (backward.path == "split")  # with dW: the partials' sum and a fix-up
    launched.clear()
    assert rms_module.backward(dY, X, W, inv_var, False, dX_without, False, backward) is None
    assert [name for name, _ in launched] == \
        ["_rms_norm_row_dot_kernel"] * (backward.path == "split") + ["_rms_norm_backward_kernel"]
    assert torch.equal(dX_with, dX_without)


@pytest.mark.parametrize("few, many", [
    (Config("rows", 4, rows=2, programs_per_sm=1), Config("rows", 4, rows=2, programs_per_sm=2)),
    (Config("split", 4, rows=2, chunk=32, programs_per_sm=1), Config("split", 4, rows=2, chunk=32, programs_per_sm=6)),
], ids=["rows", "split"])
def test_no_dw_lane_adds_more_than_dw_steps_rows_whatever_the_setting(few, many, device, monkeypatch):
    """Note [dW's serial sums]: 31 rows on 4 slots; ``few`` asks for 4 programs of 8 rows (2 a chunk
    of 16 on the split path), 4 steps of 2 rows or more. With 2 steps allowed it gets 8 programs of 4
    rows, the grid ``many`` asks for, and so its bits; without dW its own grid stands."""
    X, dY, W = _rms_inputs(monkeypatch, device, torch.float32, 31, 96, seed=7)
    _, inv_var = rms_module.forward(X, W, 1e-6, False)
    launched = _record_launches(monkeypatch)
    monkeypatch.setattr(rms_module, "DW_STEPS", 2)

    def backward(config, needs_dW):
        launched.clear()
        dX = torch.empty_like(X)
        dW = rms_module.backward(dY, X, W, inv_var, False, dX, needs_dW, config)
        grids = [grid for name, grid in launched if name == "_rms_norm_backward_kernel"]
        return grids[0][0], dX, dW

    programs, dX, dW = backward(few, True)
    assert programs == 8
    _, dX_many, dW_many = backward(many, True)
    assert torch.equal(dX, dX_many) and torch.equal(dW, dW_many)
    chunks = 1 if few.path == "rows" else 3
    assert backward(few, False)[0] == _launch.cdiv(4, chunks)  # no dW: as few programs as the setting asks for


def test_partials_stay_in_a_buffer_of_their_own_where_dx_cannot_lend_its_rows(device):
    X = torch.empty(1024, 256, dtype=torch.bfloat16, device=device)
    reserved = rms_module._reserved_rows
    assert reserved(torch.empty_like(X), X, 1024, 256, 8, 128, torch.float32) == 2
    assert reserved(X, X, 1024, 256, 8, 128, torch.float32) == 0  # dX written into dY: the fix-up reads dY again
    assert reserved(torch.empty_like(X), X, 1024, 256, 1, 1024, torch.float32) == 0  # partials under 1% of dX
    assert reserved(torch.empty_like(X), X, 1023, 256, 8, 146, torch.float32) == 0  # the last program has 1 row
    unaligned = torch.empty(1024 * 256 + 1, dtype=torch.bfloat16, device=device)[1:].view(1024, 256)
    assert reserved(unaligned, X, 1024, 256, 8, 128, torch.float32) == 0
    assert reserved(torch.empty_like(X).t(), X, 1024, 256, 8, 128, torch.float32) == 0  # not contiguous


@pytest.mark.parametrize("cols", [40, 4096, 4097])  # its own columns: 16 (a tail of 8), 16 (no tail), 64 (a tail of 1)
def test_the_partial_rows_sum_into_dw_at_any_columns_a_program(cols, device):
    """sum_partials adds all 40 partial rows (a full step of 32 and a masked one) into every column of
    dW, at the columns a program it picks and at 16 and 64: torch's float64 sum, rounded once."""
    partials = torch.randn(40, cols, generator=torch.Generator().manual_seed(cols)).to(device)
    expected = partials.double().sum(0).float()
    for columns in (None, 16, 64):
        dW = torch.full((cols,), float("nan"), device=device)
        rms_module.sum_partials(dW, partials, 40, 40, 1, 0, 4, columns=columns)
        torch.testing.assert_close(dW, expected, msg=f"columns={columns} (None: its own)")


@pytest.mark.parametrize("columns", [0, -16, 24])
def test_the_partial_rows_sum_refuses_columns_a_program_no_block_can_take(columns, device):
    """A block's width is a power of two: 0 (which a truthiness default would have read as "pick one"), a
    negative width and 24 fail before any launch, naming the width."""
    dW = torch.zeros(40, device=device)
    with pytest.raises(ValueError, match=f"power of two, got {columns}"):
        rms_module.sum_partials(dW, torch.zeros(40, 40, device=device), 40, 40, 1, 0, 4, columns=columns)


ONE_RANGE = Config("split", 4, rows=4, chunk=16, programs_per_sm=1)  # 4 slots, chunks of 16: one row range


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("variant", ["llama", "gemma"])
def test_the_split_backward_over_one_row_range_passes_the_verdict(variant, dtype, device, monkeypatch):
    """Every row in one range (13 chunks of 16 columns for 4 slots): its program stores dW itself, and
    the row sums live in dX's last bytes until the last launch writes them (Note [The row sums at dX's
    end]); forward, dX and dW within the verdict's bounds."""
    monkeypatch.setattr(rms_module, "program_slots", lambda _: 4)
    _forcing(monkeypatch, Config("rows", 4, rows=4), ONE_RANGE)
    launched = _record_launches(monkeypatch)
    case = Case("rms_norm", variant, dtype, {"lead": [3, 5], "cols": 200}, "contiguous", "normal",
                {"eps": 1e-6, "weight": "same"}, seed=4)
    result = run_case("rms_norm", case, load("kernels"), device)
    assert result.passed, result.explain()
    names = {name for name, _ in launched}
    assert "_rms_norm_tail_kernel" in names and "_sum_partials_kernel" not in names


@pytest.mark.parametrize("dtype, rows, cols, w_dtype", [
    ("bfloat16", 8, 96, None),
    ("bfloat16", 7, 97, None),  # odd columns: the sums start mid element of dX
    ("bfloat16", 1, 96, None),  # one row: its own sum in its own dX
    ("float32", 8, 96, None),
    ("float64", 8, 80, None),
    ("bfloat16", 8, 96, "float32"),  # dW in float32, X's sums in float32
])
@pytest.mark.parametrize("gemma", [False, True])
def test_the_row_sums_inside_dx_give_the_same_bits_as_a_buffer_of_their_own(dtype, rows, cols, w_dtype, gemma,
                                                                            device, monkeypatch):
    """Note [The row sums at dX's end]: the same dX and dW bits as with the sums apart, every element of
    dX written (it starts as NaN), and no partial rows summed: the one range's program stored dW."""
    X, dY, W = _rms_inputs(monkeypatch, device, getattr(torch, dtype), rows, cols, seed=rows * cols)
    if w_dtype:
        W = W.to(getattr(torch, w_dtype))
    _, inv_var = rms_module.forward(X, W, 1e-6, gemma)
    launched = _record_launches(monkeypatch)
    results = []
    for tail in (rms_module._mean_tail, lambda *args: None):
        monkeypatch.setattr(rms_module, "_mean_tail", tail)
        launched.clear()
        dX = torch.full_like(X, float("nan"))
        dW = rms_module.backward(dY, X, W, inv_var, gemma, dX, True, ONE_RANGE)
        results.append((dX, dW, [name for name, _ in launched]))
    (dX, dW, names), (dX_apart, dW_apart, names_apart) = results
    assert names == ["_rms_norm_row_dot_kernel", "_rms_norm_backward_kernel", "_rms_norm_tail_kernel"]
    assert names_apart == names[:2]
    assert not dX.isnan().any() and dW.dtype == W.dtype
    assert torch.equal(dX, dX_apart) and torch.equal(dW, dW_apart)


def test_the_row_sums_get_a_buffer_of_their_own_where_dx_cannot_lend_its_end(device):
    X = torch.empty(8, 96, dtype=torch.bfloat16, device=device)
    tail = rms_module._mean_tail
    assert tail(torch.empty_like(X), X, 8, 96, torch.float32) == 8 * 96 - 16  # 8 sums in 16 bf16 elements
    assert tail(X, X, 8, 96, torch.float32) is None  # dX written into dY: dY's last row is read until the end
    assert tail(torch.empty_like(X).t(), X, 8, 96, torch.float32) is None  # not contiguous
    unaligned = torch.empty(8 * 96 + 1, dtype=torch.bfloat16, device=device)[1:].view(8, 96)
    assert tail(unaligned, X, 8, 96, torch.float32) is None
    narrow = torch.empty(40, 8, dtype=torch.bfloat16, device=device)
    assert tail(narrow, X, 40, 8, torch.float32) is None  # 80 elements of sums: beyond the last row


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA's allocator counts the peak")
@pytest.mark.parametrize("needs_dW", [True, False], ids=["dW", "no dW"])
@pytest.mark.parametrize("rows, cols", [(1024, 8192), (256, 65536)], ids=["rows", "split"])
def test_the_backward_holds_no_more_than_dx_and_dw_beyond_its_inputs(rows, cols, needs_dW):
    X, dY = (torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    W = torch.ones(cols, dtype=torch.bfloat16, device="cuda")
    _, inv_var = rms_module.forward(X, W, 1e-6, False)
    dX = torch.empty_like(X)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    rms_module.backward(dY, X, W, inv_var, False, dX, needs_dW)
    torch.cuda.synchronize()
    # dW (a multiple of 512 bytes); without it, the split path's row sums at most
    assert torch.cuda.max_memory_allocated() - before <= (cols * 2 if needs_dW else rows * 4 * (cols == 65536))


# --- RoPE: one node, one backward launch ------------------------------------------------------------


def _projections(kind: str, device, b=2, s=5, h=4, kv=2, d=8, hidden=16):
    """Q and K as a model makes them, with the leaves gradients flow to: separate projections
    (views of two buffers), one fused QKV projection (views of one buffer, V passing through), or
    contiguous copies (not views)."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(b, s, hidden, dtype=torch.float64, generator=gen).to(device).requires_grad_()
    weights = [torch.randn(n * d, hidden, dtype=torch.float64, generator=gen).to(device).requires_grad_()
               for n in (h, kv, kv)]
    if kind == "fused":  # sliced, as models with one QKV projection do (split's views cannot be written)
        qkv = x @ torch.cat(weights).T
        q, k, v = qkv[..., :h * d], qkv[..., h * d:(h + kv) * d], qkv[..., (h + kv) * d:]
    else:
        q, k, v = (x @ w.T for w in weights)
    Q, K = q.view(b, s, h, d).transpose(1, 2), k.view(b, s, kv, d).transpose(1, 2)
    if kind == "copies":
        Q, K = Q.contiguous(), K.contiguous()
    return (x, *weights), Q, K, v


def _loss(Q, K, V):
    weights = torch.linspace(-1, 1, Q.numel(), dtype=Q.dtype, device=Q.device).view_as(Q)
    return (Q * weights).sum() + (K**2).sum() + (V**3).sum()


@pytest.mark.parametrize("kind", ["separate", "fused", "copies"])
def test_rope_backward_rotates_q_and_k_in_one_launch_with_hf_gradients(kind, device, monkeypatch):
    cos, sin = (t.double() for t in rotary_table(16, 8, 10000.0, device=device))
    leaves, Q, K, V = _projections(kind, device)
    expected = torch.autograd.grad(_loss(*apply_rotary_pos_emb(Q, K, cos[:5][None], sin[:5][None]), V), leaves)

    launches = []
    original = rope_module._rope_kernel

    class Counting:
        def __getitem__(self, grid):
            launches.append(grid)
            return original[grid]

    monkeypatch.setattr(rope_module, "_rope_kernel", Counting())
    leaves, Q, K, V = _projections(kind, device)
    rotated = kernels.rope(Q, K, cos, sin)
    assert rotated[0] is Q and rotated[1] is K
    Q.register_hook(lambda g: g)  # torch crashed here before rope refreshed the views' history
    launches.clear()
    got = torch.autograd.grad(_loss(Q, K, V), leaves)
    assert len(launches) == 1
    for g, e in zip(got, expected):
        assert torch.equal(g, e)


def test_rope_backward_with_a_gradient_for_k_alone(device):
    cos, sin = rotary_table(16, 8, 10000.0, device=device)
    Q0 = torch.randn(2, 4, 5, 8, device=device, requires_grad=True)
    K0 = torch.randn(2, 2, 5, 8, device=device, requires_grad=True)
    _, K = kernels.rope(Q0.clone(), K0.clone(), cos, sin)
    dK, = torch.autograd.grad(K.sum(), K0)
    _, K_hf = apply_rotary_pos_emb(Q0, K0, cos[:5][None], sin[:5][None])
    assert torch.equal(dK, torch.autograd.grad(K_hf.sum(), K0)[0])


def test_rope_still_bumps_every_version_counter_a_saved_tensor_depends_on(device):
    cos, sin = (t.double() for t in rotary_table(16, 8, 10000.0, device=device))
    _, Q, K, _ = _projections("separate", device)
    saved = (Q * Q).sum()  # saves Q for its backward
    kernels.rope(Q, K, cos, sin)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.backward()


def test_rope_refuses_views_autograd_forbids_writing_before_rotating_them(device):
    cos, sin = rotary_table(16, 8, 10000.0, device=device)
    qk = torch.randn(2, 5, 48, device=device, requires_grad=True).clone()
    q, k = qk.split([32, 16], dim=-1)
    Q, K = q.view(2, 5, 4, 8).transpose(1, 2), k.view(2, 5, 2, 8).transpose(1, 2)
    before = qk.detach().clone()
    with pytest.raises(ValueError, match=r"Q is a view from a function returning several views \(split"):
        kernels.rope(Q, K, cos, sin)
    assert torch.equal(qk.detach(), before)  # refused before the kernel touched it
    with torch.no_grad():
        Q = qk[..., :32].view(2, 5, 4, 8).transpose(1, 2)
    with pytest.raises(ValueError, match="Q is a view made in no_grad mode"):
        kernels.rope(Q, qk[..., 32:].view(2, 5, 2, 8).transpose(1, 2), cos, sin)
