"""The gate for a user's own op, end to end, as another repository's CI runs it
(docs/howto/gate-your-own-op.md): a temporary git repository holding a declared op and a Triton
kernel written here for the purpose, a baseline stored in that repository, and the kernel changed
three ways, each gated on the default grid (Note [Drift or regression] in oracle/report/gate.py):

- a harmless reassociation in the backward, ``(1 - t*t) * (dy * gamma)`` as
  ``(1 - t) * (1 + t) * (dy * gamma)``: drift, exit 0, whatever the CPU's vector maths;
- the backward launching ``cols // BLOCK_N`` column programs, so that the last partial block is
  skipped past 1024 columns: exit 1, seen at the declaration's special widths 1025 and 4097, which
  the declared op's default grid now sweeps (the medium width is 1000);
- the parameters' partial sums stored in bfloat16: exit 1.

and a quick run against a full baseline exits 2 before its sweep. To stay within the suite's
budget the op is declared in float32 only, the sweeps skip the aliasing checks (``--no-checks``),
which these changes do not touch, and the runs go two at a time and then all at once: one baseline
for every case, made by a module fixture, and one gate per change.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oracle.environment import platform_key
from tests.conftest import once_per_session

pytestmark = pytest.mark.skipif(platform_key() != "cpu-interpreter", reason="the interpreter's CPU gate")

OPS = '''\
"""The op, declared: Y = gamma * tanh(alpha * X) + beta, with a learnt scalar alpha."""

import torch

from oracle.declare import Dim, Op, Tensor

SCALED_TANH = Op(
    "scaled_tanh",
    reference=lambda X, alpha, gamma, beta: gamma * torch.tanh(alpha * X) + beta,
    inputs={"X": Tensor("rows", "cols"), "alpha": Tensor(1, values="weight"),
            "gamma": Tensor("cols", values="weight"), "beta": Tensor("cols", values="small")},
    dims={"rows": Dim(1, 4096, programs=True),
          "cols": Dim(1, 8192, special=(1, 7, 1025, 4097))},  # the kernel's blocks are 1024 columns wide
    dtypes=("float32",),  # one dtype keeps the test within the suite's budget
    full_sweep=({"rows": 7, "cols": 7}, {"rows": 24, "cols": 1000}, {"rows": 40, "cols": 2049}),
    outputs=("Y",),
)
'''

KERNEL = '''\
"""Y = gamma * tanh(alpha * X) + beta in Triton: programs of 16 rows by 1024 columns; the backward
sums the parameters' gradients per block of rows, in float32, and adds the blocks up after."""

import torch
import triton
import triton.language as tl

from oracle.declare.implementations import implementation

BLOCK_M, BLOCK_N = 16, 1024


@triton.jit
def _tanh(z):
    # tanh(z) = -expm1(-2|z|) / (2 + expm1(-2|z|)), expm1 by Kahan's trick: accurate near 0
    a = -2.0 * tl.abs(z)
    u = tl.exp(a)
    em1 = tl.where(u == 1.0, a, tl.where(u == 0.0, -1.0, (u - 1.0) * a / tl.log(u)))
    t = -em1 / (2.0 + em1)
    return tl.where(z < 0, -t, t)


@triton.jit
def _forward(X, A, G, B, Y, rows, cols, stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    c = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    inside = (r[:, None] < rows) & (c[None, :] < cols)
    at = r[:, None] * stride + c[None, :]
    x = tl.load(X + at, mask=inside, other=0.0).to(tl.float32)
    alpha = tl.load(A).to(tl.float32)
    gamma = tl.load(G + c, mask=c < cols, other=0.0).to(tl.float32)
    beta = tl.load(B + c, mask=c < cols, other=0.0).to(tl.float32)
    tl.store(Y + at, (gamma[None, :] * _tanh(alpha * x) + beta[None, :]).to(Y.dtype.element_ty), mask=inside)


@triton.jit
def _backward(X, A, G, DY, DX, DA, DG, DB, rows, cols, stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    m, n = tl.program_id(0), tl.program_id(1)
    r = m * BLOCK_M + tl.arange(0, BLOCK_M)
    c = n * BLOCK_N + tl.arange(0, BLOCK_N)
    inside = (r[:, None] < rows) & (c[None, :] < cols)
    at = r[:, None] * stride + c[None, :]
    x = tl.load(X + at, mask=inside, other=0.0).to(tl.float32)
    dy = tl.load(DY + at, mask=inside, other=0.0).to(tl.float32)
    alpha = tl.load(A).to(tl.float32)
    gamma = tl.load(G + c, mask=c < cols, other=0.0).to(tl.float32)
    t = _tanh(alpha * x)
    g = (1.0 - t * t) * (dy * gamma[None, :])
    tl.store(DX + at, (g * alpha).to(DX.dtype.element_ty), mask=inside)
    tl.store(DA + m * tl.num_programs(1) + n, tl.sum(tl.sum(g * x, axis=1), axis=0))
    tl.store(DG + m * cols + c, tl.sum(dy * t, axis=0).to(DG.dtype.element_ty), mask=c < cols)
    tl.store(DB + m * cols + c, tl.sum(dy, axis=0).to(DB.dtype.element_ty), mask=c < cols)


class ScaledTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X, alpha, gamma, beta):
        x = X.reshape(-1, X.shape[-1]).contiguous()
        y = torch.empty_like(x)
        grid = (triton.cdiv(x.shape[0], BLOCK_M), triton.cdiv(x.shape[1], BLOCK_N))
        _forward[grid](x, alpha, gamma, beta, y, x.shape[0], x.shape[1], x.stride(0), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
        ctx.save_for_backward(x, alpha, gamma)
        ctx.shape = X.shape
        return y.view(X.shape)

    @staticmethod
    def backward(ctx, dY):
        x, alpha, gamma = ctx.saved_tensors
        dy = dY.reshape(x.shape).contiguous()
        rows, cols = x.shape
        grid = (triton.cdiv(rows, BLOCK_M), triton.cdiv(cols, BLOCK_N))
        partials = torch.float32
        dx = torch.empty_like(x)
        da = torch.empty(grid, dtype=torch.float32, device=x.device)
        dg = torch.empty((grid[0], cols), dtype=partials, device=x.device)
        db = torch.empty((grid[0], cols), dtype=partials, device=x.device)
        _backward[grid](x, alpha, gamma, dy, dx, da, dg, db, rows, cols, x.stride(0), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
        dalpha = da.sum().reshape(alpha.shape).to(alpha.dtype)
        return dx.view(ctx.shape), dalpha, dg.float().sum(0).to(gamma.dtype), db.float().sum(0).to(gamma.dtype)


def scaled_tanh(X, alpha, gamma, beta):
    return ScaledTanh.apply(X, alpha, gamma, beta)


impl = implementation(scaled_tanh=scaled_tanh)
'''

# The three changed copies: (the line as written, the line changed).
CHANGES = {
    "reassociated": ("    g = (1.0 - t * t) * (dy * gamma[None, :])\n",
                     "    g = (1.0 - t) * (1.0 + t) * (dy * gamma[None, :])\n"),
    "last_block_skipped": ("        grid = (triton.cdiv(rows, BLOCK_M), triton.cdiv(cols, BLOCK_N))\n        partials",
                           "        grid = (triton.cdiv(rows, BLOCK_M), max(1, cols // BLOCK_N))\n        partials"),
    "bf16_partials": ("        partials = torch.float32\n", "        partials = torch.bfloat16\n"),
}
CAPABILITIES = ("default", "avx2", "avx512")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


class Repository:
    """The user's repository: its modules on PYTHONPATH, commands run from its root."""

    def __init__(self, root: Path):
        self.root = root
        self.env = {name: value for name, value in os.environ.items()
                    if name not in ("ORACLE_OP_MODULES", "PYTEST_ADDOPTS", "PYTHONPATH")}
        self.env["PYTHONPATH"] = str(root)

    def start(self, impl: str, *args: str, name: str, capability: str | None = None) -> subprocess.Popen:
        env = dict(self.env)
        if capability:
            env["ATEN_CPU_CAPABILITY"] = capability
        command = [sys.executable, "-m", "oracle.report", "--op-module", "scaled_tanh_ops", "--impl", impl,
                   "--ops", "scaled_tanh", "--no-checks", "--workers", "1", "--json", f"out/{name}.json",
                   "--html", f"out/{name}.html", *args]
        return subprocess.Popen(command, cwd=self.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

    def run_all(self, runs: dict[str, tuple]) -> dict[str, tuple[int, str]]:
        """name -> (impl, *args[, {"capability": ...}]): started at once, (exit status, output) each."""
        started = {}
        for name, (impl, *args) in runs.items():
            options = args.pop() if args and isinstance(args[-1], dict) else {}
            started[name] = self.start(impl, *args, name=name, **options)
        return {name: (proc.wait(timeout=900), proc.stdout.read()) for name, proc in started.items()}

    def document(self, name: str) -> dict:
        return json.loads((self.root / "out" / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Repository:
    """A fresh repository with the op, its kernel and the kernel's three changed copies, committed;
    the kernel's baseline of the default grid stored in it (ci/oracle-baseline.json), and one of the
    full grid (ci/full-baseline.json); then every gate of the tests below, run at once. Made once per
    session, whichever xdist workers run the tests (tests/conftest.py, once_per_session)."""
    made = once_per_session(tmp_path_factory, "user-repository", _make_repository)
    repo = Repository(Path(made["root"]))
    repo.commit, repo.runs = made["commit"], {name: tuple(run) for name, run in made["runs"].items()}
    return repo


def _make_repository(root: Path) -> dict:
    (root / "scaled_tanh_ops.py").write_text(OPS)
    (root / "scaled_tanh_triton.py").write_text(KERNEL)
    for name, (line, changed) in CHANGES.items():
        assert KERNEL.count(line) == 1, name
        (root / f"changed_{name}.py").write_text(KERNEL.replace(line, changed))
    (root / ".gitignore").write_text("out/\n__pycache__/\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "-c", "user.name=CI", "-c", "user.email=ci@example.invalid", "commit", "-q", "-m", "the op")
    repo = Repository(root)
    repo.commit = _git(root, "rev-parse", "--short=12", "HEAD")
    gate = ("--gate", "--baseline", "ci/oracle-baseline.json")
    other = next(c for c in CAPABILITIES if c != _this_capability())
    repo.runs = repo.run_all({
        "baseline": ("scaled_tanh_triton:impl", "--update-baseline", "--baseline", "ci/oracle-baseline.json"),
        "full": ("scaled_tanh_triton:impl", "--full", "--update-baseline", "--baseline", "ci/full-baseline.json")})
    repo.runs |= repo.run_all({
        "reassociated": ("changed_reassociated:impl", *gate),
        "reassociated-elsewhere": ("changed_reassociated:impl", *gate, {"capability": other}),
        "last-block": ("changed_last_block_skipped:impl", *gate),
        "bf16-partials": ("changed_bf16_partials:impl", *gate),
        "quick-against-full": ("scaled_tanh_triton:impl", "--gate", "--baseline", "ci/full-baseline.json")})
    return {"root": str(root), "commit": repo.commit, "runs": repo.runs}


def last_line(out: str) -> str:
    return out.strip().splitlines()[-1]


def _this_capability() -> str:
    import torch

    return torch.backends.cpu.get_cpu_capability().lower()


def test_the_baseline_covers_the_special_widths_and_names_the_users_repository(repository):
    code, out = repository.runs["baseline"]
    assert code == 0, out
    document = repository.document("baseline")
    widths = {cell["columns"] for cell in document["cells"]}
    assert {7, 1000, 1025, 4097} <= widths, sorted(widths)
    assert all(cell["status"] == "pass" for cell in document["cells"]), document["failures"]
    project = document["project"]
    # by its name and the declarations' path inside it: no absolute path, which means nothing elsewhere
    assert (project["name"], project["path"]) == (repository.root.name, "scaled_tanh_ops.py"), project
    assert project["from"] == "the working directory"
    assert str(repository.root) not in json.dumps([project, document["environment"]])
    assert project["commit"] == repository.commit and document["declared"] == {"scaled_tanh": "scaled_tanh_ops"}
    assert repository.commit in (repository.root / "out" / "baseline.html").read_text()
    assert "not tested:" not in out  # --ops scaled_tanh: the built-in ops were not asked


def test_a_harmless_reassociation_is_drift_not_a_regression(repository):
    code, out = repository.runs["reassociated"]
    assert code == 0, out
    comparison = repository.document("reassociated")["baseline"]
    assert comparison["regressions"] == [] and comparison["judged"] == 35
    # it did move: the ratios and bit-identities to HF of dX are reported, in the words of drift
    moved = [d for d in comparison["deltas"] if d["drift"]]
    assert any(d["key"].endswith("/dX") and d["ratio_before"] != d["ratio_now"] for d in moved), comparison["deltas"]
    assert last_line(out) == (f"gate: 35 cells judged, 0 regressions, {len(moved)} changed within their verdicts "
                              "(drift); 0 baseline cells not judged; 0 new cells; sizes judged: scaled_tanh rows "
                              "7/24/300, cols 7/16/1000/1025/4097")


def test_the_harmless_reassociation_passes_against_another_hosts_baseline(repository):
    """The issue's case: a baseline stored where torch's vector maths is one capability, the gate on
    a runner of another: HF's bits differ, the verdict does not."""
    code, out = repository.runs["reassociated-elsewhere"]
    assert code == 0, out
    assert " 0 regressions" in last_line(out) and "HF's maths rounds otherwise here" in last_line(out), last_line(out)


def test_skipping_the_last_partial_block_regresses_at_the_special_widths(repository):
    code, out = repository.runs["last-block"]
    assert code == 1, out
    comparison = repository.document("last-block")["baseline"]
    regressed = {d["key"].split("/")[3] for d in comparison["deltas"] if d["regression"]}
    assert regressed == {"scaled_tanh-default-float32-7x1025-contiguous-normal",
                         "scaled_tanh-default-float32-7x4097-contiguous-normal"}, regressed
    # the unwritten gradients, named by what found them
    assert any(r.startswith("scaled_tanh-default-float32-7x1025-contiguous-normal: new finding of the unwritten "
                            "check on dX: ") for r in comparison["regressions"]), comparison["regressions"]


def test_partial_sums_rounded_to_16_bits_regress(repository):
    code, out = repository.runs["bf16-partials"]
    assert code == 1, out
    regressions = repository.document("bf16-partials")["baseline"]["regressions"]
    assert {r.split(":")[0].rsplit("/", 1)[1] for r in regressions} == {"dgamma", "dbeta"}, regressions
    assert any("precision lost" in r for r in regressions), regressions


def test_a_quick_run_against_a_full_baseline_exits_2_before_its_sweep(repository):
    code, out = repository.runs["full"]
    assert code == 0, out
    code, out = repository.runs["quick-against-full"]
    assert code == 2, out
    assert "error: " in out and "never passes what it did not judge" in out, out
    assert "not in the quick grid of this run (the baseline's is full)" in out, out
    assert not (repository.root / "out" / "quick-against-full.json").exists()  # refused before the sweep


def test_a_declared_op_without_its_module_is_hinted(repository):
    proc = subprocess.run([sys.executable, "-m", "oracle.report", "--impl", "scaled_tanh_triton:impl", "--ops",
                           "scaled_tanh", "--gate"], cwd=repository.root, env=repository.env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert "invalid choice: 'scaled_tanh'" in proc.stderr and "--op-module MODULE" in proc.stderr, proc.stderr
