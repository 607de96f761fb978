"""The GPU path: bf16 autocast with fp32 cores, the SDPA kernels `full` and the bench's references stand for,
and the CUDA peak-memory probe.

Each property that does not need CUDA is checked on the CPU too (CPU autocast to bf16 and PyTorch's CPU flash
kernel), so the fast tier exercises these assertions everywhere and a broken core fails here, not first on a GPU
node. The `cuda` variants and the CUDA-only tests carry the `gpu` mark (`pytest -m gpu`; skipped without CUDA).
The oracles are fp64 softmax attention computed here, never the code under test.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from lra_bench.registry import ATTENTIONS, build_attention
from lra_bench.run.build import build_network as build_classifier
from models.encoder import MultiHeadAttention

NO_CUDA = not torch.cuda.is_available()
GPU = [pytest.mark.gpu, pytest.mark.skipif(NO_CUDA, reason="needs a CUDA device")]
DEVICES = ["cpu", pytest.param("cuda", marks=GPU)]
# Sequence length and batch of the training-step test: the protocol's n on CUDA, a quarter of it on the CPU; and
# how far bf16-autocast logits may be from fp32 ones (relative): measured 0.004–0.013 on the CPU at n=256, with
# room for the longer reductions at n=1024. A core left in bf16 is caught by the dtype check first (and pivoted's
# logits moved by 0.23 when the fp32 core was switched off).
SHAPE = {"cpu": (256, 2), "cuda": (1024, 8)}
LOGIT_TOL = {"cpu": 0.03, "cuda": 0.05}


def attn_and_selector(name: str) -> tuple[dict, dict | None]:
    """The attention's config node and its paper's selector, as `run.py attn=<name>` composes them."""
    from tests.conftest import compose

    cfg = compose([f"attn={name}"])
    return dict(cfg.attn), (dict(cfg.selector) if ATTENTIONS.get(name).takes_selector else None)


# An m that no other tensor of the test has as both trailing dims (d=32, 2d=64, dim=48, n): the paper defaults
# (64, 128) coincide with 2d or with the qk-concatenated token width, which would blur what "the core" is.
CORE_M = 40


def classifier(name: str, seq_len: int) -> torch.nn.Module:
    attn, selector = attn_and_selector(name)
    if isinstance(attn.get("num_landmarks"), int):
        attn["num_landmarks"] = CORE_M
    return build_classifier(
        vocab_size=17,
        seq_len=seq_len,
        num_classes=10,
        dual=False,
        # dim 48 ≠ heads·head_dim: no weight is square, so an m×m tensor can only be a landmark core
        model=dict(dim=48, depth=2, num_heads=2, head_dim=32, ffn_dim=128, head_hidden=128, dropout=0.1),
        attn=attn,
        selector=selector,
    )


SOLVERS = ("eigh", "svd", "qr", "solve", "inv", "pinv", "cholesky", "lstsq", "eig")


class CoreDtypes(TorchDispatchMode):
    """Records the floating dtypes of every operator that touches an m×m tensor (a landmark core) and of every
    decomposition or solve. A dispatch mode sits below autocast: it sees the dtypes the kernels really ran in."""

    def __init__(self, core_sizes: set[int]) -> None:
        super().__init__()
        self.core_sizes = core_sizes
        self.core_ops: list[tuple[str, set[torch.dtype]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        floats = {t.dtype for t in tensors if t.is_floating_point()}
        is_core = any(t.dim() >= 2 and t.shape[-1] == t.shape[-2] in self.core_sizes for t in tensors)
        if floats and (is_core or any(word in func.__name__ for word in SOLVERS)):
            self.core_ops.append((func.__name__, floats))
        return out


def rank_budgets(model: torch.nn.Module, n: int) -> set[int]:
    """The m of every attention that has an m×m landmark core at length n: the landmark attentions and Skyformer
    (none for full, performer, linformer, polynomial, whose rank budget is not a core)."""
    counts = set()
    for mha in (m for m in model.modules() if isinstance(m, MultiHeadAttention)):
        attention = mha.attention
        if attention.takes_selector or attention.name == "skyformer":
            counts.add(int(attention.rank_budget(n)))
    return counts


def make_batch(n: int, batch: int, device: str) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 17, (batch, n), generator=gen)
    mask = torch.ones(batch, n, dtype=torch.bool)
    mask[:, int(0.85 * n) :] = False  # ListOps-like padding at the end
    ids[~mask] = 0
    labels = torch.randint(0, 10, (batch,), generator=gen)
    return {k: v.to(device) for k, v in {"input_ids": ids, "mask": mask, "label": labels}.items()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ATTENTIONS.names())
def test_bf16_autocast_step_is_finite_keeps_fp32_cores_and_tracks_fp32(name: str, device: str) -> None:
    n, b = SHAPE[device]
    torch.manual_seed(0)
    model = classifier(name, n).to(device)
    batch = make_batch(n, b, device)
    square = {p.shape[-1] for p in model.parameters() if p.dim() >= 2 and p.shape[-1] == p.shape[-2]}
    others = square | {n, 32, 64}  # weights, the sequence, head_dim and the qk-concatenated width
    assert not rank_budgets(model, n) & others, "an m×m core must not be mistaken for another tensor"

    model.eval()  # no dropout: the bf16 and fp32 logits of the same weights are compared
    with torch.no_grad():
        reference = model(batch).float()
        with torch.autocast(device, dtype=torch.bfloat16):
            low = model(batch).float()
    rel = float(torch.linalg.norm(low - reference) / torch.linalg.norm(reference))
    assert rel < LOGIT_TOL[device], f"bf16 autocast logits are {rel:.3f} (relative) away from fp32"

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in model.parameters()]
    mode = CoreDtypes(rank_budgets(model, n))
    with mode, torch.autocast(device, dtype=torch.bfloat16):
        loss = F.cross_entropy(model(batch).float(), batch["label"])
    with mode:
        loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert any(not torch.equal(p0, p1.detach()) for p0, p1 in zip(before, model.parameters())), "no update"
    if mode.core_sizes:
        assert mode.core_ops, f"no operator on an m×m core (m ∈ {mode.core_sizes}) was seen"
    low_precision = [(op, sorted(map(str, d))) for op, d in mode.core_ops if not d <= {torch.float32, torch.float64}]
    assert not low_precision, f"core operators outside fp32: {low_precision[:5]}"


def oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention in fp64, written out (no SDPA): softmax(q kᵀ/√d) v over the real keys."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.linalg.norm(x.double() - ref) / torch.linalg.norm(ref))


def qkv(device: str, dtype: torch.dtype, n: int = 2048, b: int = 4) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    # scaled so the softmax is peaked (rows far from uniform): a wrong scale or a dropped key shows at once
    return [(2.0 * torch.randn(b, 2, n, 32, generator=gen)).to(device, dtype) for _ in range(3)]


@pytest.mark.parametrize("device", DEVICES)
def test_full_runs_on_the_flash_kernel_and_matches_the_fp64_oracle(device: str) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = qkv(device, torch.bfloat16)
    full = build_attention("full", head_dim=32, num_heads=2, seq_len=2048).eval()
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # raises "No available kernel" if full's call cannot use flash
        ours = full(q, k, v, None)
        flash = F.scaled_dot_product_attention(q, k, v)
    ref = oracle(q, k, v)
    assert torch.equal(ours, flash)
    assert rel_err(ours, ref) < 1e-2  # bf16 inputs and output: ~3 significant digits


@pytest.mark.parametrize("device", DEVICES)
def test_full_with_padding_matches_the_fp64_oracle_at_real_tokens(device: str) -> None:
    q, k, v = qkv(device, torch.bfloat16, n=1024)
    mask = torch.ones(4, 1024, dtype=torch.bool, device=device)
    mask[0, 700:] = False
    mask[2, 100:] = False
    full = build_attention("full", head_dim=32, num_heads=2, seq_len=1024).eval()
    out = full(q, k, v, mask)
    ref = oracle(q, k, v, mask)
    for row in range(4):
        real = mask[row]
        assert rel_err(out[row][:, real], ref[row][:, real]) < 1e-2, row


def reference_names(device: str) -> list[str]:
    """The bench references with a kernel on this device (memory-efficient attention has no CPU kernel)."""
    from lra_bench.bench.references import REFERENCES

    return [r for r in REFERENCES if device == "cuda" or r != "sdpa_efficient"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bench_references_compute_exact_attention(device: str, dtype: torch.dtype) -> None:
    from lra_bench.bench.references import SDPAReference, reference_dtype

    for name in reference_names(device):
        run_dtype = reference_dtype(name, torch.device(device), dtype)
        q, k, v = qkv(device, run_dtype, n=1024, b=2)
        out = SDPAReference(name)(q, k, v, None)
        tol = 1e-5 if run_dtype == torch.float32 else 1e-2
        assert out.dtype == run_dtype and rel_err(out, oracle(q, k, v)) < tol, (name, run_dtype)


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs a CUDA device")
def test_cuda_peak_memory_counts_what_the_phase_allocates_not_the_baseline() -> None:
    from lra_bench.memory import PeakMemory

    device = torch.device("cuda")
    resident = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)  # 64 MiB before the phase
    meter = PeakMemory(device)
    meter.start()
    block = torch.empty(128 * 2**20, dtype=torch.uint8, device=device)  # 128 MiB inside it, then freed
    del block
    peak, baseline, method = meter.stop()
    assert method == "cuda_max_memory_allocated"
    assert baseline >= 64 * 2**20
    assert 128 * 2**20 <= peak < 130 * 2**20
    del resident


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs a CUDA device")
def test_bench_cuda_memory_sees_the_score_matrix_of_math_and_not_of_flash() -> None:
    """sdpa_math materialises B·H·n² fp32 scores; the flash kernel never does: a physical bound each way."""
    from lra_bench.bench.worker import measure

    b, h, n = 2, 2, 4096
    spec = dict(
        kind="reference", B=b, H=h, d=32, n=n, device="cuda", dtype="float32", mask=False, modes=["forward"],
        warmup=1, max_warmup_s=5, repeats=2, min_repeats=1, max_time_s=5, seed=0,
    )  # fmt: skip
    math_row = measure({**spec, "attn": "sdpa_math"})["forward"]
    flash_row = measure({**spec, "attn": "sdpa_flash"})["forward"]
    scores = b * h * n * n * 4
    assert math_row["status"] == flash_row["status"] == "ok", (math_row, flash_row)
    assert math_row["mem_method"] == flash_row["mem_method"] == "cuda_max_memory_allocated"
    assert flash_row["dtype"] == "bfloat16"  # FlashAttention-2 has no fp32 kernel: the bench feeds it bf16
    assert math_row["peak_mem_bytes"] >= scores
    assert flash_row["peak_mem_bytes"] < scores / 16
