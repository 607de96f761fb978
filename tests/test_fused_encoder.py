"""The encoder's compiled chain (`models/kernels/fused_encoder.cpp`, `model.kernels=fused`): each fused step against
its eager form with the kernel's own dropout mask (fp64 values and gradients, fp32 at rounding, torch's gradcheck),
the mask's distribution and its independence from the thread count, the encoder on both paths (the same model in
evaluation, reproducible from torch's seed in training), the fallback where the kernel cannot run, and how the
choice is recorded: in the identity and in every training segment, never in the architecture a checkpoint must match.

The first test in a fresh cache compiles the kernel (about a minute); the rest load it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from scipy import stats

from models.kernels import flash_attention, fused_encoder
from tests.conftest import REPO, TINY_LISTOPS, fault, run_cli, run_record

pytestmark = pytest.mark.skipif(fused_encoder.kernel() is None, reason="the kernel cannot be built here")

P = 0.3
SEED = 1234
EPS = 1e-5  # nn.LayerNorm's
B, N, H, D, WIDTH = 2, 37, 3, 4, 10  # 74 rows: more than one block of rows for no width here (blocks are 16K values)


def keep_scaled(rows: int, cols: int, dtype: torch.dtype, p: float = P, seed: int = SEED) -> torch.Tensor:
    """The kernel's keep mask times 1 / (1 − p'), `[rows, cols]`: what the eager oracle multiplies by."""
    threshold = min(round(p * 2**32), 2**32 - 1)
    mask = fused_encoder.built().keep_mask(seed, rows, cols, p)
    return mask.to(dtype) * (2**32 / (2**32 - threshold))


def leaves(dtype: torch.dtype, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(shape, dtype=dtype, generator=gen).requires_grad_() for shape in shapes]


def key_mask() -> torch.Tensor:
    """`[B, N]`: the second sequence ends in 7 pads."""
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, N - 7 :] = False
    return mask


# each case: (its leaves' shapes, fused(*leaves), eager oracle(*leaves, dtype)) — outputs as tuples
CASES: dict[str, tuple[list[tuple[int, ...]], Any, Any]] = {
    "bias + dropout + residual": (
        [(B, N, WIDTH), (B, N, WIDTH), (WIDTH,)],
        lambda r, y, b: (fused_encoder.BiasDropoutAdd.apply(r, y, b.view(1, -1), P, SEED),),
        lambda r, y, b, dt: (r + (y + b) * keep_scaled(B * N, WIDTH, dt).view(B, N, WIDTH),),
    ),
    "position + dropout (no residual)": (
        [(B, N, WIDTH), (N, WIDTH)],
        lambda y, pos: (fused_encoder.BiasDropoutAdd.apply(None, y, pos, P, SEED),),
        lambda y, pos, dt: ((y + pos) * keep_scaled(B * N, WIDTH, dt).view(B, N, WIDTH),),
    ),
    "bias + dropout + residual, and its layer norm": (
        [(B, N, WIDTH), (B, N, WIDTH), (WIDTH,), (WIDTH,), (WIDTH,)],
        lambda r, y, b, w, s: fused_encoder.BiasDropoutAddNorm.apply(r, y, b.view(1, -1), P, SEED, w, s, EPS),
        lambda r, y, b, w, s, dt: _normed(r + (y + b) * keep_scaled(B * N, WIDTH, dt).view(B, N, WIDTH), w, s),
    ),
    "position + dropout (no residual), and its layer norm": (
        [(B, N, WIDTH), (N, WIDTH), (WIDTH,), (WIDTH,)],
        lambda y, pos, w, s: fused_encoder.BiasDropoutAddNorm.apply(None, y, pos, P, SEED, w, s, EPS),
        lambda y, pos, w, s, dt: _normed((y + pos) * keep_scaled(B * N, WIDTH, dt).view(B, N, WIDTH), w, s),
    ),
    "bias + gelu + dropout": (
        [(B, N, WIDTH), (WIDTH,)],
        lambda h, b: (fused_encoder.BiasGeluDropout.apply(h, b, P, SEED),),
        lambda h, b, dt: (F.gelu(h + b) * keep_scaled(B * N, WIDTH, dt).view(B, N, WIDTH),),
    ),
    "bias + gelu, no dropout": (
        [(B, N, WIDTH), (WIDTH,)],
        lambda h, b: (fused_encoder.BiasGeluDropout.apply(h, b, 0.0, SEED),),
        lambda h, b, dt: (F.gelu(h + b),),
    ),
    "head split (+ bias, v masked)": (
        [(B, N, 3 * H * D), (3 * H * D,)],
        lambda proj, b: fused_encoder.SplitHeads.apply(proj, b, key_mask(), H),
        lambda proj, b, dt: _eager_split(proj, b),
    ),
    "head merge (masked)": (
        [(B, H, N, D)],
        lambda ctx: (fused_encoder.MergeHeads.apply(ctx, key_mask()),),
        lambda ctx, dt: ((ctx * key_mask()[:, None, :, None]).transpose(1, 2).reshape(B, N, H * D),),
    ),
}


def _normed(x: torch.Tensor, weight: torch.Tensor, shift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` and its layer norm, as the eager block computes the next sublayer's input."""
    return x, F.layer_norm(x, (x.shape[-1],), weight, shift, EPS)


def _eager_split(proj: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`MultiHeadAttention.project` plus the bias and v's mask, as the eager encoder does them."""
    q, k, v = (proj + bias).view(B, N, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)
    return q, k, v * key_mask()[:, None, :, None]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_each_fused_step_matches_its_eager_form_with_the_kernels_mask(
    case: str, dtype: torch.dtype, tol: float
) -> None:
    shapes, fused, eager = CASES[case]
    inputs = leaves(dtype, *shapes)
    ours, oracle = fused(*inputs), eager(*inputs, dtype)
    for got, want in zip(ours, oracle, strict=True):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    gen = torch.Generator().manual_seed(1)
    upstream = [torch.randn(o.shape, dtype=dtype, generator=gen) for o in oracle]
    for got, want in zip(
        torch.autograd.grad(ours, inputs, upstream), torch.autograd.grad(oracle, inputs, upstream), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("case", list(CASES))
def test_each_fused_step_passes_gradcheck_in_fp64(case: str) -> None:
    shapes, fused, _ = CASES[case]
    assert torch.autograd.gradcheck(lambda *xs: fused(*xs), tuple(leaves(torch.float64, *shapes)))


def test_head_major_tensors_are_read_through_their_strides() -> None:
    """An attention's gradients reach the head split as transposed or sliced views (nystrom's dk and gpa's dq and dk
    are `[B, H, D, N]` in memory, spectral's are halves of one tensor, linformer's dk and dv `[H, N, B, D]`), and a
    context may be a view too: the kernel reads them in place (a D-major one along N, the masked v's too; a batch
    interleaved within a sequence's stride through a copy), with the values of their contiguous copies."""
    proj, bias = leaves(torch.float64, (B, N, 3 * H * D), (3 * H * D,))
    q, k, v = fused_encoder.SplitHeads.apply(proj, bias, key_mask(), H)
    gen = torch.Generator().manual_seed(2)
    transposed = torch.randn(B, H, D, N, dtype=torch.float64, generator=gen).transpose(-1, -2)
    sliced = torch.randn(B, H, N, 2 * D, dtype=torch.float64, generator=gen)[..., :D]
    token_major = torch.randn(B, N, H, D, dtype=torch.float64, generator=gen).transpose(1, 2)
    interleaved = torch.randn(H, N, B, D, dtype=torch.float64, generator=gen).permute(2, 0, 1, 3)  # linformer's dk, dv
    assert not any(t.is_contiguous() for t in (transposed, sliced, token_major, interleaved))
    for views in ((transposed, sliced, token_major), (sliced, token_major, transposed), (interleaved,) * 3):
        strided = torch.autograd.grad((q, k, v), (proj, bias), views, retain_graph=True)
        copied = torch.autograd.grad((q, k, v), (proj, bias), [t.contiguous() for t in views], retain_graph=True)
        assert all(torch.equal(a, b) for a, b in zip(strided, copied, strict=True))
    for context in (token_major, transposed, interleaved):
        assert torch.equal(
            fused_encoder.merge_heads(context, key_mask()), fused_encoder.merge_heads(context.contiguous(), key_mask())
        )


def test_the_mask_is_the_flash_kernels_hash_and_keeps_each_value_with_probability_one_minus_p() -> None:
    """One hash for every compiled dropout (`hash_dropout.h`): the encoder's rows are stream 0 of the flash kernel's
    mask; each value is kept independently with probability 1 − p'."""
    p = 0.1
    mask = fused_encoder.built().keep_mask(7, 2048, 512, p)
    assert torch.equal(mask, flash_attention.built().keep_mask(7, 0, 2048, 512, p))
    dropped = int((~mask).sum())
    assert stats.binomtest(dropped, mask.numel(), round(p * 2**32) / 2**32).pvalue > 1e-4
    assert 0.17 < (mask != fused_encoder.built().keep_mask(8, 2048, 512, p)).float().mean() < 0.19  # 2·p·(1−p)


def _big_split(proj: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, ...]:
    mask = torch.ones(proj.shape[:2], dtype=torch.bool)
    mask[1, -100:] = False
    return fused_encoder.SplitHeads.apply(proj, bias, mask, 2)


# at the faithful widths and 2 × 2048 rows: many blocks of rows, split between the threads
#: the linear product's weight in `THREAD_CASES` (a constant: see there)
PRODUCT_WEIGHT = torch.randn(192, 64, generator=torch.Generator().manual_seed(3))

THREAD_CASES: dict[str, tuple[list[tuple[int, ...]], Any]] = {
    "bias + dropout + residual": (
        [(2, 2048, 64), (2, 2048, 64), (64,)],
        lambda r, y, b: (fused_encoder.BiasDropoutAdd.apply(r, y, b.view(1, -1), 0.1, SEED),),
    ),
    "bias + dropout + residual, and its layer norm": (
        [(2, 2048, 64), (2, 2048, 64), (64,), (64,), (64,)],
        lambda r, y, b, w, s: fused_encoder.BiasDropoutAddNorm.apply(r, y, b.view(1, -1), 0.1, SEED, w, s, EPS),
    ),
    "position + dropout": (
        [(2, 2048, 64), (2048, 64)],
        lambda y, pos: (fused_encoder.BiasDropoutAdd.apply(None, y, pos, 0.1, SEED),),
    ),
    "bias + gelu + dropout": (
        [(2, 2048, 128), (128,)],
        lambda h, b: (fused_encoder.BiasGeluDropout.apply(h, b, 0.1, SEED),),
    ),
    "head split": ([(2, 2048, 192), (192,)], _big_split),
    # the product and its input gradient; the weight gradient is torch's `mm` over all 4,096 rows, as `F.linear`'s
    # backward has it, and Intel's MKL splits that sum by thread count (so does the eager form): its weight is fixed
    "linear product (oneDNN)": ([(2, 2048, 64)], lambda x: (fused_encoder.product(x, PRODUCT_WEIGHT),)),
}


@pytest.mark.parametrize("case", list(THREAD_CASES))
def test_the_results_do_not_depend_on_the_thread_count(case: str) -> None:
    """Values and gradients, the bias sums included (fixed blocks of rows, summed in order), bit for bit with one
    and with two threads."""
    shapes, fused = THREAD_CASES[case]
    inputs = leaves(torch.float32, *shapes)
    results = []
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            out = fused(*inputs)
            upstream = [torch.randn(o.shape, generator=torch.Generator().manual_seed(2)) for o in out]
            results.append((*out, *torch.autograd.grad(out, inputs, upstream)))
    finally:
        torch.set_num_threads(threads)
    for one, two in zip(*results, strict=True):
        assert torch.equal(one, two)


@pytest.mark.skipif(not fused_encoder.onednn_products(), reason="this torch has no oneDNN fp32 linear")
@pytest.mark.parametrize(("rows", "k", "f"), [(2 * 2048, 64, 192), (2 * 2048, 128, 64), (37, 10, 7)])
def test_the_linear_products_are_onednns_and_match_torchs_with_their_gradients(rows: int, k: int, f: int) -> None:
    """The fused path's unbiased linear layers (`fused_encoder.product`): oneDNN's matmul is what runs, forward and
    for the input gradient, and values and both gradients agree with `F.linear` at fp32 rounding (the faithful
    widths and a ragged one)."""
    x, weight = leaves(torch.float32, (2, rows // 2, k), (f, k))
    with torch.profiler.profile() as prof:
        ours = fused_encoder.product(x, weight)
        upstream = torch.randn(ours.shape, generator=torch.Generator().manual_seed(4))
        grads = torch.autograd.grad(ours, [x, weight], upstream)
    calls = sum(e.count for e in prof.key_averages() if e.key == "mkldnn::_linear_pointwise")
    assert calls == 2  # the product and the input gradient's
    oracle = F.linear(x, weight)
    torch.testing.assert_close(ours, oracle, rtol=2e-6, atol=2e-6)
    for got, want in zip(grads, torch.autograd.grad(oracle, [x, weight], upstream), strict=True):
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)


# -- the encoder on both paths --------------------------------------------------------------------------------------
def network(kernels: str, dtype: torch.dtype = torch.float32, attn: str = "nystrom") -> torch.nn.Module:
    """A small classifier with this attention (weights from seed 0), the encoder's chain on `kernels`."""
    from lra_bench.registry import build_attention, build_selector
    from models.build import build_classifier

    def make_attention(layer: int, n: int) -> Any:
        if attn == "full":
            return build_attention("full", head_dim=8, num_heads=2, seq_len=n, dropout=0.1)
        selector = build_selector("segment_means")
        return build_attention(attn, head_dim=8, num_heads=2, seq_len=n, selector=selector, num_landmarks=8)

    model_cfg = dict(dim=16, depth=2, num_heads=2, head_dim=8, ffn_dim=32, dropout=0.1, pooling="mean_legacy")
    torch.manual_seed(0)
    model = build_classifier(
        vocab_size=20,
        seq_len=64,
        num_classes=5,
        dual=False,
        model={**model_cfg, "kernels": kernels},
        make_attention=make_attention,
    )
    return model.to(dtype)


def batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    mask = torch.arange(64)[None, :] < torch.tensor([64, 40, 17])[:, None]
    return {
        "input_ids": torch.randint(1, 20, (3, 64), generator=gen) * mask,
        "mask": mask,
        "label": torch.tensor([0, 3, 1]),
    }


def loss_and_grads(model: torch.nn.Module) -> list[torch.Tensor]:
    data = batch()
    loss = F.cross_entropy(model(data), data["label"])
    return [loss.detach(), *torch.autograd.grad(loss, list(model.parameters()))]


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-10), (torch.float32, 2e-5)])
@pytest.mark.parametrize("attn", ["nystrom", "full"])
def test_the_encoder_computes_the_same_model_on_both_paths(dtype: torch.dtype, tol: float, attn: str) -> None:
    """Without dropout (evaluation mode) the two paths are one function of one set of weights: loss and every
    parameter's gradient agree at the dtype's rounding."""
    fused, eager = network("fused", dtype, attn).eval(), network("eager", dtype, attn).eval()
    eager.load_state_dict(fused.state_dict())
    for got, want in zip(loss_and_grads(fused), loss_and_grads(eager), strict=True):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_training_draws_its_masks_from_torchs_seed() -> None:
    """Two runs of one seed are bit-identical (loss and gradients); another seed, or the eager path's stream, draws
    other masks."""
    model = network("fused").train()

    def seeded(seed: int, m: torch.nn.Module = model) -> list[torch.Tensor]:
        torch.manual_seed(seed)
        return loss_and_grads(m)

    first, again, other = seeded(5), seeded(5), seeded(6)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], other[0])
    eager = network("eager").train()
    eager.load_state_dict(model.state_dict())
    assert not torch.equal(first[0], seeded(5, eager)[0])


def test_the_encoder_falls_back_to_eager_where_the_kernel_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under autocast (bf16 products the kernel does not take) and where the kernel is not built, `fused` runs the
    eager chain: the same numbers as `eager`, in training too (the same dropout stream)."""
    fused, eager = network("fused").train(), network("eager").train()
    eager.load_state_dict(fused.state_dict())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.manual_seed(1)
        a = fused(batch())
        torch.manual_seed(1)
        b = eager(batch())
    assert torch.equal(a, b)
    monkeypatch.setattr(fused_encoder, "kernel", lambda: None)
    torch.manual_seed(1)
    a = loss_and_grads(fused)
    torch.manual_seed(1)
    b = loss_and_grads(eager)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_an_unknown_kernels_value_is_refused_in_one_line() -> None:
    from lra_bench.config.validate import check_choices
    from lra_bench.errors import ConfigError
    from tests.conftest import compose

    with pytest.raises(ValueError, match="model.kernels='flash'"):
        network("flash")
    with pytest.raises(ConfigError, match="model.kernels='flash': expected one of auto, fused, eager"):
        check_choices(compose(["model.kernels=flash"]))


# -- how the choice is recorded -------------------------------------------------------------------------------------
def test_the_kernels_are_in_the_identity_but_not_in_the_architecture_or_the_protocol() -> None:
    """`model.kernels` moves results (fp32 rounding, another dropout stream), so it is in the identity and the
    fingerprint; a checkpoint of one path loads on the other, and either path is on-protocol."""
    from lra_bench.config import conformance
    from lra_bench.errors import ConfigError
    from lra_bench.record.checkpoint_file import META_FORMAT, META_KEY
    from lra_bench.record.identity import config_identity, fingerprint
    from lra_bench.run.checkpoints import check_fits
    from tests.conftest import compose

    def identity(*overrides: str) -> dict[str, Any]:
        cfg = compose(["task=listops", "attn=nystrom", "protocol=nystromformer", *overrides])
        return config_identity(cfg)

    fused, eager = identity("model.kernels=fused"), identity("model.kernels=eager")
    assert fingerprint(fused) != fingerprint(eager)
    assert fused["model.kernels"] == "fused" and "model.kernels" not in eager  # eager: the baseline, left out
    checkpoint = {META_KEY: {"format": META_FORMAT, "identity": fused}, "state_dict": {}}
    assert check_fits("last.ckpt", eager, checkpoint=checkpoint) is checkpoint
    with pytest.raises(ConfigError, match="model.dropout"):
        check_fits("last.ckpt", identity("model.dropout=0.2"), checkpoint=checkpoint)
    for each in (fused, eager):
        found = conformance.check(each, "listops", "nystromformer", "nystrom", "segment_means")
        assert "model.kernels" not in (found["deviations"] or {})


def test_a_run_made_before_the_choice_keeps_its_fingerprint_on_the_eager_path() -> None:
    """Committed evidence from before `model.kernels` existed (spectral's faithful seed 0) is the experiment today's
    eager config makes, fingerprint and all — the config `make reproduce` runs, which names the table's path
    (`reproduce.KERNELS`) whatever a run's default is: an in-progress snapshot of it resumes into its folder
    (`rundir.check_same_experiment` compares fingerprints), and its seeds stay one leaderboard row."""
    from lra_bench import reproduce
    from lra_bench.config.compose import compose_config
    from lra_bench.config.conformance import derive_run_keys
    from lra_bench.kit.plain import plain_dict
    from lra_bench.record.identity import (
        DATA_KEYS,
        KERNEL_BASELINES,
        LEGACY_DATA_KEYS,
        config_identity,
        fingerprint,
        under,
    )
    from models.encoder import UNSET_KERNELS

    assert KERNEL_BASELINES == {"model.kernels": UNSET_KERNELS}
    stored = json.loads((REPO / "reproductions/nystromformer/listops/spectral/seed-0/identity.json").read_text())
    data = {k: v for k, v in stored["identity"].items() if under(k, (*DATA_KEYS, *LEGACY_DATA_KEYS))}
    command = reproduce.command("nystromformer", "listops", "spectral", 0, "data", 1, Path("w"), [])
    assert "model.kernels=eager" in command
    protocol = ["task=listops", "protocol=nystromformer", "attn=spectral", "selector=uniform", "~local"]
    cfg = compose_config([*protocol, "model.kernels=eager"])
    derive_run_keys(cfg)
    today = {**config_identity(plain_dict(cfg)), **data}
    assert today == stored["identity"] and fingerprint(today) == stored["fingerprint"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_checkpoint_trained_fused_resumes_eager_and_the_segments_say_so(tmp_path: Path) -> None:
    """Segment 1 trains on the fused path and stops at step 4 (last.ckpt); segment 2 resumes that checkpoint on the
    eager path in its own run dir and completes. The record lists both segments with their kernels."""
    args = [*TINY_LISTOPS, "attn=nystrom", "trainer.max_steps=6"]  # last.ckpt after the validations at 2, 4
    first = run_cli([*args, "model.kernels=fused", "run_name=fused", *fault(nan_loss_at_step=5)], tmp_path, check=False)
    assert first.returncode != 0
    last = tmp_path / "outputs" / "listops" / "nystrom" / "fused" / "checkpoints" / "last.ckpt"
    run_cli([*args, "model.kernels=eager", "run_name=eager", f"ckpt_path={last}"], tmp_path)
    record = run_record(tmp_path / "outputs" / "listops" / "nystrom" / "eager")
    assert record["status"] == "completed" and record["run"]["resumed_from_step"] == 4
    segments = record["run"]["segments"]
    assert [s["from_step"] for s in segments] == [0, 4]
    assert [s["kernels"] for s in segments] == [{"model.kernels": "fused"}, {"model.kernels": "eager"}]
    assert "model.kernels" not in record["identity"] and math.isfinite(record["metrics"]["test_acc"])


def test_fused_asked_where_it_cannot_run_is_recorded_as_the_eager_path_that_ran(tmp_path: Path) -> None:
    """`model.kernels=fused` under bf16 autocast computes the eager chain (`fused_encoder.applies`): the run says so
    in one line and its record, identity and fingerprint name `eager` — the experiment an eager run of the same
    config is — instead of a fused path that never ran."""
    from lra_bench.record.identity import identity_of

    args = [*TINY_LISTOPS, "attn=nystrom", "trainer.max_steps=2", "trainer.precision=bf16-mixed"]
    proc = run_cli([*args, "model.kernels=fused", "run_name=asked-fused"], tmp_path)
    assert "model.kernels=fused runs as eager: trainer.precision=bf16-mixed" in proc.stderr
    asked = run_record(tmp_path / "outputs" / "listops" / "nystrom" / "asked-fused")
    run_cli([*args, "model.kernels=eager", "run_name=eager"], tmp_path)
    eager = run_record(tmp_path / "outputs" / "listops" / "nystrom" / "eager")
    assert asked["config"]["model"]["kernels"] == "eager" and identity_of(asked)["model.kernels"] == "eager"
    assert asked["fingerprint"] == eager["fingerprint"]
    assert [s["kernels"] for s in asked["run"]["segments"]] == [{"model.kernels": "eager"}]


def test_the_default_takes_the_compiled_chain_where_it_runs_and_records_it(tmp_path: Path) -> None:
    """`model.kernels=auto`, the default: on a CPU in fp32 the run trains on the fused chain without a word, and its
    record, identity and segments name `fused` — the experiment `model.kernels=fused` makes."""
    from lra_bench.record.identity import identity_of

    args = [*TINY_LISTOPS, "attn=nystrom", "trainer.max_steps=2"]
    proc = run_cli([*args, "run_name=default"], tmp_path)
    assert "model.kernels" not in proc.stderr
    record = run_record(tmp_path / "outputs" / "listops" / "nystrom" / "default")
    assert record["config"]["model"]["kernels"] == "fused" and identity_of(record)["model.kernels"] == "fused"
    assert [s["kernels"] for s in record["run"]["segments"]] == [{"model.kernels": "fused"}]


def test_the_path_a_run_computes_on_is_settled_from_its_device_precision_and_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from models.encoder import kernels_that_run

    assert kernels_that_run("fused", "cpu", "32-true") == ("fused", None)
    assert kernels_that_run("eager", "cuda", "bf16-mixed") == ("eager", None)
    assert kernels_that_run("fused", "cuda", "32-true")[0] == "eager"
    assert kernels_that_run("fused", "cpu", "bf16-true")[0] == "eager"
    assert kernels_that_run("auto", "cpu", "32-true") == ("fused", None)
    assert kernels_that_run("auto", "cuda", "32-true") == ("eager", None)  # asked for nothing more: no line
    assert kernels_that_run("auto", "cpu", "bf16-mixed") == ("eager", None)
    monkeypatch.setattr(fused_encoder, "kernel", lambda: None)  # a machine without a compiler
    assert kernels_that_run("fused", "cpu", "32-true") == ("eager", "the kernel could not be built on this machine")
    assert kernels_that_run("auto", "cpu", "32-true") == ("eager", None)
