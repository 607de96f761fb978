"""The compiled CPU kernels (`models.kernels`). Flash attention with in-kernel dropout: against the materialised
form with the kernel's own mask (fp64 values and gradients, fp32 at rounding), torch's gradcheck, the mask's
distribution, independence from the thread count, and `attn=full` routing its CPU training through it. The row
log-sum-exp of residual-pivoted attention and the degree-2 features of polynomial attention: against their eager
forms (values and gradients), gradcheck, and each attention whole on both kernels. Nyström's convolution skip: against
the eager conv (values, both gradients), gradcheck, the thread count, and the encoder taking it with its chain.

The first test in a fresh cache compiles the kernels (about a minute each); the rest load them."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

from models import kernels
from models.attention.full import FullAttention, FullConfig
from models.kernels import flash_attention, row_logsumexp
from tests.conftest import REPO
from tests.kernel_paths import encoder_attention, on_one_and_two_threads

pytestmark = pytest.mark.skipif(flash_attention.kernel() is None, reason="the kernel cannot be built here")

P = 0.1
THRESHOLD = round(P * 2**32)
KEEP_SCALE = 2**32 / (2**32 - THRESHOLD)


def materialised(q, k, v, keys, p, seed):
    """The oracle: every n × n weight, the kernel's keep mask applied, then the product with v (autograd's own
    gradients through softmax and the products)."""
    b, h, n, d = q.shape
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    scores = scores.masked_fill(~keys[:, None, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    mask = torch.stack([flash_attention.kernel().keep_mask(seed, i, n, k.shape[-2], p) for i in range(b * h)])
    scale = 2**32 / (2**32 - min(round(p * 2**32), 2**32 - 1))
    return (weights * mask.view(b, h, n, -1) * scale) @ v


def inputs(dtype: torch.dtype, b: int = 2, h: int = 3, n: int = 300, d: int = 16):
    """q, k, v (requiring grad) and a padded key mask: the last sequence ends in n/6 pads (at n = 300: 50, and the
    rows span more than one block of queries, the last block of 44)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, dtype=dtype, generator=gen).requires_grad_() for _ in range(3))
    keys = torch.ones(b, n, dtype=torch.bool)
    keys[-1, n - n // 6 :] = False
    return q, k, v, keys


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_values_and_gradients_match_the_materialised_form(dtype: torch.dtype, tol: float) -> None:
    q, k, v, keys = inputs(dtype)
    upstream = torch.randn(q.shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
    ours = flash_attention.flash_dropout_attention(q, k, v, keys, P, seed=1234)
    oracle = materialised(q, k, v, keys, P, 1234)
    torch.testing.assert_close(ours, oracle, rtol=tol, atol=tol)
    grads = torch.autograd.grad(ours, (q, k, v), upstream), torch.autograd.grad(oracle, (q, k, v), upstream)
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_a_sequence_of_pads_only_attends_to_nothing() -> None:
    """A query whose keys are all pads (a sequence of pads only) gets 0 and sends no gradient, where a materialised
    softmax over −inf scores gives NaN; the other sequence is untouched."""
    q, k, v, keys = inputs(torch.float32, b=2, h=2, n=40, d=8)
    keys[1] = False
    out = flash_attention.flash_dropout_attention(q, k, v, keys, P, seed=3)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert torch.all(out[1] == 0) and all(torch.all(g[1] == 0) for g in grads)
    torch.testing.assert_close(out[0], materialised(q, k, v, keys, P, 3)[0], rtol=2e-5, atol=2e-5)


def test_keys_after_the_last_attended_one_are_never_read() -> None:
    """A head's blocks end at its last attended key (a right-padded sequence's pads have weight exactly 0): the
    trailing pads' keys and values are not read — NaN there changes nothing, bit for bit — and get exact zero
    gradients, while a pad with attended keys after it (a hole in the mask) is still masked as before."""
    q, k, v, keys = inputs(torch.float32, b=2, h=2, n=300, d=8)
    keys[0, 40:45] = False  # a hole: attended keys follow it
    keys[1, 200:] = False  # a trailing run of pads
    upstream = torch.randn(q.shape, generator=torch.Generator().manual_seed(2))
    out = flash_attention.flash_dropout_attention(q, k, v, keys, P, seed=21)
    grads = torch.autograd.grad(out, (q, k, v), upstream)
    k_nan, v_nan = (t.detach().clone() for t in (k, v))
    k_nan[1, :, 200:], v_nan[1, :, 200:] = float("nan"), float("nan")
    k_nan.requires_grad_(), v_nan.requires_grad_()
    out_nan = flash_attention.flash_dropout_attention(q, k_nan, v_nan, keys, P, seed=21)
    grads_nan = torch.autograd.grad(out_nan, (q, k_nan, v_nan), upstream)
    assert torch.equal(out, out_nan) and all(torch.equal(a, b) for a, b in zip(grads, grads_nan))
    assert torch.all(grads[1][1, :, 200:] == 0) and torch.all(grads[2][1, :, 200:] == 0)
    torch.testing.assert_close(out, materialised(q, k, v, keys, P, 21), rtol=2e-5, atol=2e-5)


def test_torch_gradcheck_in_fp64() -> None:
    q, k, v, keys = inputs(torch.float64, b=1, h=2, n=20, d=4)
    bias = torch.zeros(keys.shape, dtype=torch.float64).masked_fill_(~keys, float("-inf"))
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_attention.FlashDropoutAttention.apply(q, k, v, bias, 0.3, 99), (q, k, v)
    )


def test_each_weight_is_kept_with_probability_one_minus_p_independently() -> None:
    mask = flash_attention.kernel().keep_mask(7, 3, 1024, 2048, P).numpy()
    dropped = int((~mask).sum())
    assert stats.binomtest(dropped, mask.size, THRESHOLD / 2**32).pvalue > 1e-4
    # neighbours along a row and down a column are independent (χ² on the 2×2 tables)
    for a, b in ((mask[:, :-1], mask[:, 1:]), (mask[:-1], mask[1:])):
        table = np.array([[np.sum(a & b), np.sum(a & ~b)], [np.sum(~a & b), np.sum(~a & ~b)]])
        assert stats.chi2_contingency(table).pvalue > 1e-4, table
    other_head = flash_attention.kernel().keep_mask(7, 4, 1024, 2048, P).numpy()
    other_seed = flash_attention.kernel().keep_mask(8, 3, 1024, 2048, P).numpy()
    assert 0.17 < np.mean(mask != other_head) < 0.19 and 0.17 < np.mean(mask != other_seed) < 0.19  # 2·p·(1−p)


def test_kept_weights_are_scaled_so_the_expectation_is_the_softmax() -> None:
    q, k, v, keys = inputs(torch.float64, b=1, h=1, n=64, d=8)
    identity = torch.eye(64, dtype=torch.float64)[None, None]  # v = I: the output is the dropped weight matrix
    dropped = flash_attention.flash_dropout_attention(q, k, identity, None, P, seed=5)
    weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8), dim=-1)
    kept = dropped != 0
    torch.testing.assert_close(dropped[kept], weights[kept] * KEEP_SCALE, rtol=1e-12, atol=0)


def test_the_result_does_not_depend_on_the_thread_count() -> None:
    q, k, v, keys = inputs(torch.float32, b=3, h=2, n=260, d=8)
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            out = flash_attention.flash_dropout_attention(q, k, v, keys, P, seed=11)
            lse = row_logsumexp.RowLogSumExp.apply(q, k, flash_attention.key_bias(keys, 3, 260, q.dtype))
            results.append((out, lse, *torch.autograd.grad(out.sum() + lse.sum(), (q, k, v))))
    finally:
        torch.set_num_threads(threads)
    for one, two in zip(*results):
        assert torch.equal(one, two)


def test_full_attention_trains_through_the_kernel_and_is_seeded_by_torch() -> None:
    q, k, v, keys = inputs(torch.float32)
    fused = FullAttention(16, 3, 300, FullConfig(dropout=P)).train()
    torch.manual_seed(3)
    first = fused(q, k, v, keys)
    torch.manual_seed(3)
    again = fused(q, k, v, keys)
    torch.manual_seed(3)
    seed = kernels.draw_seed()
    assert torch.equal(first, again)
    assert torch.equal(first, flash_attention.flash_dropout_attention(q, k, v, keys, P, seed=seed))
    assert not torch.equal(first, fused(q, k, v, keys))  # a fresh mask on the next call
    # evaluation has no dropout: SDPA, the same on both paths
    eager = FullAttention(16, 3, 300, FullConfig(dropout=P, kernel="eager")).eval()
    torch.testing.assert_close(fused.eval()(q, k, v, keys), eager(q, k, v, keys))


def test_an_unknown_kernel_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="attn.kernel='flash'"):
        FullAttention(16, 3, 300, FullConfig(kernel="flash"))


def test_a_checkpoint_trained_on_one_kernel_loads_under_the_other() -> None:
    """`attn.kernel` is in the identity (it moves results at fp32 rounding) but not in the architecture a checkpoint
    must match: the weights mean the same on both paths. Another dropout still refuses."""
    from lra_bench.errors import ConfigError
    from lra_bench.record.checkpoint_file import META_FORMAT, META_KEY
    from lra_bench.run.checkpoints import check_fits

    made = {"attn.name": "full", "attn.dropout": 0.1, "attn.kernel": "fused", "model.dim": 64}
    checkpoint = {META_KEY: {"format": META_FORMAT, "identity": made}, "state_dict": {}}
    assert check_fits("best.ckpt", {**made, "attn.kernel": "eager"}, checkpoint=checkpoint) is checkpoint
    with pytest.raises(ConfigError, match="attn.dropout"):
        check_fits("best.ckpt", {**made, "attn.dropout": 0.0}, checkpoint=checkpoint)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-4)])
def test_the_row_log_sum_exp_matches_the_blockwise_eager_form(dtype: torch.dtype, tol: float) -> None:
    """Residual-pivoted attention's exact column normaliser: the compiled kernel against `BlockwiseLSE` (values and
    gradients), a row with no attended key included (−inf, no gradient)."""
    from models.attention.pivoted import BlockwiseLSE

    q, k, _, keys = inputs(dtype)
    keys[0] = False  # the first sequence has no real token at all
    upstream = torch.randn(q.shape[:-1], dtype=dtype, generator=torch.Generator().manual_seed(2))
    valid = keys[:, None, None, :]
    ours = row_logsumexp.RowLogSumExp.apply(q, k, flash_attention.key_bias(keys, 2, 300, dtype))
    eager = BlockwiseLSE.apply(q, k, valid, 64)
    assert torch.equal(torch.isinf(ours), torch.isinf(eager)) and torch.isinf(ours[0]).all()
    torch.testing.assert_close(ours, eager, rtol=tol, atol=tol)
    grads = torch.autograd.grad(ours, (q, k), upstream), torch.autograd.grad(eager, (q, k), upstream)
    for got, want in zip(*grads):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_the_row_log_sum_exp_passes_gradcheck() -> None:
    q, k, _, keys = inputs(torch.float64, b=1, h=2, n=20, d=4)
    bias = flash_attention.key_bias(keys, 1, 20, torch.float64)
    assert torch.autograd.gradcheck(lambda q, k: row_logsumexp.RowLogSumExp.apply(q, k, bias), (q, k))


def test_pivoted_attention_is_the_same_on_both_kernels() -> None:
    """The whole residual-pivoted attention, fused and eager, at fp32 rounding (same landmarks, same sketch)."""
    from lra_bench.registry import build_attention, build_selector

    q, k, v, keys = inputs(torch.float32)
    results = []
    for kernel in ("fused", "eager"):
        geometry = {"head_dim": 16, "num_heads": 3, "seq_len": 300}
        selector = build_selector("pivoted_qr", num_landmarks=16)
        attention = build_attention("pivoted", **geometry, selector=selector, num_landmarks=16, kernel=kernel)
        out = attention.train()(q, k, v, keys)
        results.append((out, *torch.autograd.grad(out.sum(), (q, k, v))))
    for fused, eager in zip(*results):
        torch.testing.assert_close(fused, eager, rtol=1e-4, atol=1e-5)


def test_polynomial_features_match_the_torch_form() -> None:
    """The compiled degree-2 features: forward bit-identical to the torch form (the same products in the same order),
    gradients at rounding level against it, torch's gradcheck in fp64 (the features, and the blocked core over 70
    rows: a whole block of 64 and a part one), and the whole attention on both kernels (n = 300: four whole blocks
    and one of 44 rows), its fused form keeping no `[n, F]` tensor for the backward."""
    from lra_bench.registry import build_attention
    from models.kernels import polynomial_features

    geometry = {"head_dim": 16, "num_heads": 3, "seq_len": 300}
    fused, eager = (build_attention("polynomial", **geometry, kernel=k) for k in ("fused", "eager"))
    x = torch.randn(2, 3, 50, 16, generator=torch.Generator().manual_seed(4), requires_grad=True)
    ours, theirs = fused.features(x), eager.features(x)
    assert torch.equal(ours, theirs)
    upstream = torch.randn(ours.shape, generator=torch.Generator().manual_seed(5))
    got, want = torch.autograd.grad(ours, x, upstream)[0], torch.autograd.grad(theirs, x, upstream)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    small = torch.randn(3, 5, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(polynomial_features.DegreeTwoFeatures.apply, (small,))
    gen = torch.Generator().manual_seed(6)
    core = [torch.randn(2, 70, c, dtype=torch.float64, generator=gen, requires_grad=True) for c in (5, 5, 4)]
    assert torch.autograd.gradcheck(polynomial_features.DegreeTwoAttention.apply, tuple(core))
    q, k, v, keys = inputs(torch.float32)
    outputs, kept = [], []
    for attention in (fused, eager):
        sizes: list[int] = []

        def keep(t: torch.Tensor, sizes: list[int] = sizes) -> torch.Tensor:
            sizes.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            out = attention.train()(q, k, v, keys)
        kept.append(max(sizes))
        outputs.append((out, *torch.autograd.grad(out.sum(), (q, k, v))))
    for a, b in zip(*outputs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    rows = q.shape[:-1].numel()  # b·h·n
    assert kept == [rows * (16 + 1), rows * 16 * 17 // 2], "fused: nothing larger than [V | 1] kept; eager: φ"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_blocked_core_lifts_and_folds_as_the_rows_do(dtype: torch.dtype) -> None:
    """The blocked core computes φ and its backward along a block's rows (vectorised); each row must get the row form's
    operations in their order. With S the identity (a one-hot row per feature: every product and sum exact), `apply`
    returns the block's φ and `backward_through` folds A itself: bit for bit `forward` and `backward` of the row form,
    over 70 rows (a block of 64 and a part one)."""
    from models.kernels import polynomial_features

    kernel = polynomial_features.built()
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(2, 70, 16, dtype=dtype, generator=gen)
    features = 16 * 17 // 2
    identity = torch.eye(features, dtype=dtype).expand(2, features, features).contiguous()
    grads = torch.randn(2, 70, features, dtype=dtype, generator=gen)
    rows_x, rows_grads = x.reshape(-1, 16), grads.reshape(-1, features)
    assert torch.equal(kernel.apply(x, identity).reshape(-1, features), kernel.forward(rows_x))
    assert torch.equal(kernel.backward_through(x, grads, identity).reshape(-1, 16), kernel.backward(rows_grads, rows_x))


def test_the_blocked_polynomial_core_does_not_depend_on_the_thread_count() -> None:
    """The core's block products go to the BLAS from inside its own parallel loop, or from the calling thread where
    that loop runs inline; MKL threads a product itself there unless told not to (blas.h), and summed in another order:
    the summary, its application and the backward on 1 and 2 torch threads give the same bits (one group: the loop
    inline; six: split over the threads)."""
    from models.kernels import polynomial_features

    kernel = polynomial_features.built()
    gen = torch.Generator().manual_seed(12)
    for groups in (1, 6):
        x, y = (torch.randn(groups, 150, 8, generator=gen) for _ in range(2))
        w = torch.randn(groups, 150, 9, generator=gen)

        def core(x: torch.Tensor = x, y: torch.Tensor = y, w: torch.Tensor = w) -> list[torch.Tensor]:
            summary = kernel.summary(y, w)
            return [summary, kernel.apply(x, summary), kernel.backward_through(x, w, summary)]

        one, two = on_one_and_two_threads(core)
        assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))


def conv_skip(n: int, d: int, dtype: torch.dtype) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """Nyström attention (3 heads, the protocol's 35 taps), values `[2, 3, n, d]` and a key mask whose second sequence
    ends in pads."""
    from lra_bench.registry import build_attention, build_selector

    attention = build_attention(
        "nystrom", head_dim=d, num_heads=3, seq_len=n, selector=build_selector("segment_means"), num_landmarks=4
    ).to(dtype)
    gen = torch.Generator().manual_seed(7)
    v = torch.randn(2, 3, n, d, dtype=dtype, generator=gen, requires_grad=True)
    keys = torch.ones(2, n, dtype=torch.bool)
    keys[1, n - n // 3 :] = False
    return attention, v, keys


def skip_and_grads(attention: Any, v: torch.Tensor, keys: torch.Tensor, compiled: bool) -> list[torch.Tensor]:
    """The skip on the path `compiled` names, and its gradients with respect to `v` and the taps."""
    attention.compiled = compiled
    out = attention.skip(v, keys)
    upstream = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(8))
    return [out, *torch.autograd.grad(out, (v, attention.conv.weight), upstream)]


# (n, d): an interior that ends in a part chunk (300 rows: (300 - 34) · 16 = 66 chunks of 64 and 32 more), taps cut
# at both ends of every row (20 rows < 35 taps), a width that is no multiple of a vector (5)
CONV_SHAPES = [(300, 16), (20, 8), (77, 5)]


@pytest.mark.parametrize(("n", "d"), CONV_SHAPES)
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_the_convolution_skip_matches_the_eager_form(n: int, d: int, dtype: torch.dtype, tol: float) -> None:
    """Nyström's convolution skip, compiled (`models.kernels.depthwise_conv`) against the eager channels-last conv:
    values, the values' gradient and the taps' gradient, pads zeroed before the convolution; fp32's forward is the
    same sums in the same order (equal up to FMA contraction)."""
    attention, v, keys = conv_skip(n, d, dtype)
    ours, eager = skip_and_grads(attention, v, keys, True), skip_and_grads(attention, v, keys, False)
    for got, want in zip(ours, eager, strict=True):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol * max(1.0, float(want.detach().abs().max())))
    assert "DepthwiseConv" in type(ours[0].grad_fn).__name__  # the compiled path ran


def test_the_convolution_skip_passes_gradcheck_and_ignores_the_thread_count() -> None:
    """torch's gradcheck in fp64 (values and taps, pads in the second sequence); and the fp32 results, the taps'
    gradient summed over slabs included, bit for bit the same on 1 and 2 threads."""
    from models.kernels.depthwise_conv import DepthwiseConv

    _, v, keys = conv_skip(20, 3, torch.float64)
    weight = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(9), requires_grad=True)
    assert torch.autograd.gradcheck(lambda v, w: DepthwiseConv.apply(v, keys, w), (v, weight))
    attention, v, keys = conv_skip(300, 16, torch.float32)
    one, two = on_one_and_two_threads(lambda: skip_and_grads(attention, v, keys, True))
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))


def test_the_encoder_runs_the_convolution_skip_compiled_exactly_where_its_chain_is() -> None:
    """`model.kernels` says how the whole network computes: the encoder's compiled chain (auto, fused) takes the
    compiled skip with it, the eager one keeps the eager conv."""
    from lra_bench.registry import build_attention, build_selector

    def nystrom(layer: int, n: int) -> Any:
        return build_attention("nystrom", head_dim=8, num_heads=2, seq_len=n, selector=build_selector("segment_means"))

    def skip_path(kernels: str) -> str:
        attention = encoder_attention(kernels, nystrom)
        v = torch.randn(1, 2, 64, 8, requires_grad=True)
        return type(attention.skip(v, None).grad_fn).__name__

    assert "DepthwiseConv" in skip_path("fused") and "DepthwiseConv" in skip_path("auto")
    assert "DepthwiseConv" not in skip_path("eager")


def _load_in_a_fresh_process(name: str, checkout: Path) -> subprocess.CompletedProcess[str]:
    """`models.kernels.load(name)` in a new process that imports `models` from `checkout`; prints the module's file."""
    script = (
        f"from models.kernels import load; import sys; m = load({name!r}); print(m and m.__file__); sys.exit(m is None)"
    )
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    try:
        return subprocess.run(
            [sys.executable, "-c", script], cwd=checkout, env=env, capture_output=True, text=True, timeout=240
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading {name} from {checkout} took over 240 s")


def test_a_second_checkout_loads_the_same_build_without_compiling(tmp_path: Path) -> None:
    """Two checkouts of the same sources (two worktrees, a second clone on a cluster) share the kernel cache: the
    second loads the first one's build as it is. torch's loader compiles from the sources' absolute paths, so a
    build made from another checkout's path was compiled again, a minute each time two checkouts took turns."""
    name = "polynomial_features"
    assert kernels.load(name) is not None
    (library,) = kernels.build_dir(name).glob("*.so")
    before = library.stat()
    shutil.copytree(REPO / "models", tmp_path / "models", ignore=shutil.ignore_patterns("__pycache__"))
    done = _load_in_a_fresh_process(name, tmp_path)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == library
    after = library.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), "the second checkout rebuilt it"


def test_two_environments_build_in_their_own_folders(tmp_path: Path) -> None:
    """The compiler's command names torch's headers by the path torch is imported from, and ninja compiles again when
    the command changes: a venv and a link to it (a worktree's `.venv` link) taking turns on one build folder compiled
    a minute each turn, and a run waiting on that lock timed out. Each environment has its own folder."""
    link = tmp_path / "venv-link"
    link.symlink_to(Path(sys.prefix), target_is_directory=True)
    script = "import torch, models.kernels as k; print(torch.__file__, k.build_dir('polynomial_features'))"
    command = [str(link / "bin" / "python"), "-c", script]
    torch_file, folder = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert torch_file.startswith(str(link)), torch_file  # the linked environment is what that process imports from
    assert Path(folder).parent == kernels.cache_dir()
    assert Path(folder) != kernels.build_dir("polynomial_features"), "two environments share one build folder"
    # (the same environment in a second process or checkout keeps its folder: the second-checkout test)


def test_a_build_killed_mid_way_does_not_block_the_next_load() -> None:
    """torch's loader leaves its `lock` file behind when the build holding it is killed, and a later load then waits
    on it forever (a CI run ended at its time limit inside `make install`). A fresh process finding such a leftover
    in the build folder loads the kernel (and removes the leftover) instead of waiting."""
    name = "polynomial_features"
    assert kernels.load(name) is not None
    leftover = kernels.build_dir(name) / kernels.TORCH_BUILD_MARK
    leftover.touch()  # what a killed build leaves (harmless to every load of ours: the fix under test removes it)
    done = _load_in_a_fresh_process(name, REPO)
    assert done.returncode == 0, done.stderr
    assert not leftover.exists()


def test_the_install_step_builds_every_kernel_where_a_run_loads_it() -> None:
    """`python -m models.kernels` (what `make install` runs, a process per kernel) names every kernel source beside
    the module a run then loads: the same build folder, so the first run compiles nothing."""
    done = subprocess.run(
        [sys.executable, "-m", "models.kernels"], cwd=REPO, capture_output=True, text=True, timeout=600, check=True
    )
    listed = dict(line.removeprefix("[lra-bench] kernel ").split(": ", 1) for line in done.stdout.splitlines())
    assert sorted(listed) == sorted(p.stem for p in kernels.SOURCES.glob("*.cpp"))
    for name, where in listed.items():
        module = kernels.load(name)
        assert module is not None and Path(where) == Path(str(module.__file__)), name
