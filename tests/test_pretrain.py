"""Self-pretraining (stage=pretrain, pretrained=): objectives, data isolation, exact loading, refusals, leaderboard.

The pretraining runs here are real runs of `lra_bench.run.train.train` on generated ListOps (in-process, to keep the
fast tier fast); the one-command experiment and resuming through run.py are in `test_pretrain_e2e.py`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from omegaconf import DictConfig

from lra_bench.config.stages import resolve_stage
from lra_bench.config.validate import validate
from lra_bench.errors import ConfigError
from lra_bench.record.checkpoint_file import load_checkpoint
from lra_bench.registry import ATTENTIONS, build_attention
from lra_bench.run import pretrain as stage
from lra_bench.run.build import build_datamodule, build_model, build_module
from lra_bench.run.entry import run_stage
from models.attention.full import FullAttention
from tasks.base import ArrowSplit
from tasks.cache import arrays_to_dataset
from tasks.masking import IGNORE_INDEX, mlm_corrupt, next_token_targets
from tests.conftest import TINY_LISTOPS, compose, run_cli

TINY = [a for a in TINY_LISTOPS if a != "logger=csv"] + ["logger=none", "diagnostics.enabled=false"]


def tiny_cfg(tmp: Path, *overrides: str) -> DictConfig:
    return compose([*TINY, f"data_dir={tmp / 'data'}", f"output_root={tmp / 'outputs'}", *overrides])


@pytest.fixture(scope="module")
def pretrained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One completed tiny `stage=pretrain` run (attn=full, mlm), shared by the fine-tuning tests."""
    root = tmp_path_factory.mktemp("spt")
    out = root / "outputs" / "pretrain-full"
    torch.set_num_threads(1)
    record = run_stage(tiny_cfg(root, "attn=full", "stage=pretrain", "trainer.max_steps=6"), out)
    assert record["status"] == "completed"
    return out


# -- objectives ---------------------------------------------------------------------------------------------------
def test_masking_follows_the_ratio_and_only_real_tokens() -> None:
    ids = torch.randint(1, 17, (64, 200))
    real = torch.arange(200)[None, :] < torch.randint(50, 201, (64, 1))
    inputs, targets = mlm_corrupt(ids, real, 0.5, 17, np.random.default_rng(0))
    chosen = targets != IGNORE_INDEX
    assert not (chosen & ~real).any(), "a pad was masked"
    assert torch.equal(inputs[chosen], torch.full_like(inputs[chosen], 17)) and torch.equal(
        targets[chosen], ids[chosen]
    )
    assert torch.equal(inputs[~chosen], ids[~chosen])
    share = chosen.sum().item() / real.sum().item()
    assert abs(share - 0.5) < 0.02, share  # Bernoulli(0.5) over ~8000 real tokens


def test_next_token_targets_are_the_shifted_real_tokens() -> None:
    ids = torch.tensor([[5, 6, 7, 0, 0], [1, 2, 3, 4, 5]])
    real = ids > 0
    assert next_token_targets(ids, real).tolist() == [[6, 7, -100, -100, -100], [2, 3, 4, 5, -100]]


def test_token_loss_matches_a_numpy_oracle() -> None:
    rng = np.random.default_rng(3)
    out = torch.from_numpy(rng.normal(size=(2, 7, 5)).astype(np.float32))
    target = torch.from_numpy(rng.integers(0, 5, (2, 7)))
    target[0, :3] = IGNORE_INDEX
    loss, correct = stage.token_loss(out, target, "ce", 4.0)
    logits, wanted = out.numpy()[target.numpy() != -100], target.numpy()[target.numpy() != -100]
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    assert math.isclose(loss.item(), -logp[np.arange(len(wanted)), wanted].mean(), rel_tol=1e-5)
    assert correct.tolist() == (logits.argmax(-1) == wanted).tolist()
    pixels = torch.tensor([[0, 255, IGNORE_INDEX, 128]])
    pred = torch.tensor([[[0.1], [1.0], [7.0], [0.5]]])
    loss, correct = stage.token_loss(pred, pixels, "l1", 255.0)
    assert math.isclose(loss.item(), (0.1 + 0.0 + abs(0.5 - 128 / 255)) / 3, rel_tol=1e-6)
    assert correct.tolist() == [False, True, True]  # round(25.5)=26≠0, 255, round(127.5)=128


def test_mlm_loss_decreases_below_the_unigram_floor_on_a_tiny_dataset(tmp_path: Path) -> None:
    """Real data module, network and LightningModule's loss: after 300 steps the masked-token loss on the held-out
    slice is well below where it started, and below the masked tokens' unigram entropy — the best a head that
    learnt only the token frequencies (its bias) could reach — so the encoder's features are being learnt."""
    torch.manual_seed(0)
    cfg = tiny_cfg(tmp_path, "attn=full", "stage=pretrain", "task.gen_num_train=400", "spt.holdout_fraction=0.2")
    validate(cfg)
    resolve_stage(cfg)
    dm = build_datamodule(cfg)
    dm.setup()
    module = stage.build_pretrain_module(cfg, dm, build_model(cfg, dm), {})
    held = [dm.collate(dm.splits["val"].__getitems__(list(range(len(dm.splits["val"])))))]

    def held_loss() -> float:
        module.eval()
        with torch.no_grad():
            return float(stage.token_loss(module(held[0]), held[0]["target"], "ce", 16.0)[0])

    targets = held[0]["target"][held[0]["target"] != IGNORE_INDEX].numpy()
    freq = np.bincount(targets, minlength=17) / len(targets)
    unigram = -(freq[freq > 0] * np.log(freq[freq > 0])).sum()
    before = held_loss()
    optimizer = torch.optim.AdamW(module.parameters(), lr=3e-3)
    steps = 0
    while steps < 300:
        for batch in dm.train_dataloader():
            module.train()
            loss = stage.token_loss(module(batch), batch["target"], "ce", 16.0)[0]
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            if steps == 300:
                break
    after = held_loss()
    assert after < 0.9 * before, (before, after)
    assert after < unigram - 0.05, f"held-out masked loss {after:.3f} vs unigram entropy {unigram:.3f}"


# -- data isolation -----------------------------------------------------------------------------------------------
def test_pretraining_data_serves_train_inputs_only(tmp_path: Path) -> None:
    """The task's val and test splits are replaced by sentinel tokens before the pretraining view is set up; no
    pretraining batch (train or its validation curve) may contain one, every example served is a train example,
    each exactly once per pass, and the test loader refuses."""
    cfg = tiny_cfg(tmp_path, "attn=full", "stage=pretrain")
    validate(cfg)
    resolve_stage(cfg)
    dm = build_datamodule(cfg)
    dm.task.setup()
    sentinel = 99
    for split in ("val", "test"):
        n, length = len(dm.task.splits[split]), dm.task.seq_len
        arrays = {
            "input_ids": np.full((n, length), sentinel, dtype=np.int16),
            "length": np.full(n, length, dtype=np.int32),
            "label": np.zeros(n, dtype=np.int64),
        }
        dm.task.splits[split] = ArrowSplit(arrays_to_dataset(arrays), ("input_ids", "length", "label"))
    dm.setup()
    train_ids = np.asarray(dm.task.splits["train"].table["input_ids"])
    served: list[int] = []
    for loader, name in ((dm.train_dataloader(), "train"), (dm.val_dataloader(), "val")):
        for batch in loader:
            for key in ("input_ids", "target"):
                assert not (batch[key] == sentinel).any(), f"a val/test token reached the pretraining {name} loader"
            assert "label" not in batch
    for split in dm.splits.values():
        rows = split.__getitems__(list(range(len(split))))
        assert np.array_equal(rows["input_ids"], train_ids[rows["index"]])
        served += rows["index"].tolist()
    assert sorted(served) == list(range(len(train_ids)))  # train ∪ hold-out = the train split, disjoint
    with pytest.raises(RuntimeError, match="never reads the test split"):
        dm.test_dataloader()


# -- fine-tuning from a pretraining run ---------------------------------------------------------------------------
def _finetune_module(tmp: Path, pretrained: Path, *overrides: str) -> tuple[pl.LightningModule, DictConfig]:
    cfg = tiny_cfg(tmp, "attn=full", f"pretrained='{pretrained}'", *overrides)
    validate(cfg)
    source = resolve_stage(cfg)
    dm = build_datamodule(cfg)
    dm.setup()
    pl.seed_everything(0)
    return build_module(cfg, dm, source), cfg


def test_finetune_loads_exactly_the_pretrained_encoder_and_a_fresh_head(pretrained_run: Path, tmp_path: Path) -> None:
    module, cfg = _finetune_module(tmp_path, pretrained_run)
    state = load_checkpoint(pretrained_run / "checkpoints" / "last.ckpt")["state_dict"]
    encoder = {k[len("model.encoder.") :]: v for k, v in state.items() if k.startswith("model.encoder.")}
    mine = module.model.encoder.state_dict()
    assert mine.keys() == encoder.keys() and len(mine) > 10
    for key, value in encoder.items():
        assert torch.equal(mine[key], value), f"encoder tensor {key} differs from the pretrained one"
    assert mine["token_emb.weight"].shape[0] == 17 + 1  # the mask token's row came along
    # the head is the fresh one a scratch build with the same seed gets, and nothing of the LM head
    scratch_cfg = tiny_cfg(tmp_path, "attn=full")
    validate(scratch_cfg)
    resolve_stage(scratch_cfg)
    dm = build_datamodule(scratch_cfg)
    dm.setup()
    scratch_cfg.pretraining = "mlm"  # same shapes as the fine-tune (one more embedding row), nothing loaded
    pl.seed_everything(0)
    scratch = build_model(scratch_cfg, dm)
    for key, value in scratch.head.state_dict().items():
        assert torch.equal(module.model.head.state_dict()[key], value), f"head tensor {key} is not a fresh init"
    assert not torch.equal(scratch.encoder.token_emb.weight, mine["token_emb.weight"])
    assert cfg.pretraining == "mlm" and len(cfg.pretraining_fingerprint) == 16


def test_a_checkpoint_file_of_the_run_can_be_named_instead(pretrained_run: Path, tmp_path: Path) -> None:
    best = sorted((pretrained_run / "checkpoints").glob("best-*.ckpt"))[-1]
    module, cfg = _finetune_module(tmp_path, best)
    state = load_checkpoint(best)["state_dict"]
    assert torch.equal(module.model.encoder.token_emb.weight, state["model.encoder.token_emb.weight"])
    source = resolve_stage(cfg)
    assert source.checkpoint == best and source.run_dir == pretrained_run


def test_gpa_codebook_is_loaded_with_the_encoder(tmp_path: Path) -> None:
    out = tmp_path / "outputs" / "pretrain-gpa"
    cfg = tiny_cfg(tmp_path, "attn=gpa", "stage=pretrain", "trainer.max_steps=4", "selector.refresh_every=2")
    assert run_stage(cfg, out)["status"] == "completed"
    cfg = tiny_cfg(tmp_path, "attn=gpa", f"pretrained='{out}'", "selector.refresh_every=2")
    validate(cfg)
    source = resolve_stage(cfg)
    dm = build_datamodule(cfg)
    dm.setup()
    module = build_module(cfg, dm, source)
    state = load_checkpoint(out / "checkpoints" / "last.ckpt")["state_dict"]
    books = [k for k in state if k.endswith("selector.codebook")]
    assert books and all(state[k].abs().sum() > 0 for k in books)  # refreshed during pretraining
    for key in books:
        assert torch.equal(module.model.encoder.state_dict()[key[len("model.encoder.") :]], state[key])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.dim=32"], "its encoder differs from this run's in model.dim 16 → 32"),
        (["attn=nystrom", "attn.num_landmarks=8"], "its encoder differs from this run's in attn.name full → nystrom"),
        (["task.seq_len=128", "task.max_length=128"], "task.seq_len 64 → 128"),
        (["pretraining=causal"], "pretraining=causal: this key is derived (here: mlm)"),
    ],
)
def test_a_mismatched_finetune_is_one_line(
    pretrained_run: Path, tmp_path: Path, overrides: list[str], message: str
) -> None:
    cfg = tiny_cfg(tmp_path, "attn=full", f"pretrained='{pretrained_run}'", *overrides)
    validate(cfg)
    with pytest.raises(ConfigError) as err:
        resolve_stage(cfg)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_one_command_experiment_refuses_an_outside_encoder(pretrained_run: Path, tmp_path: Path) -> None:
    cfg = tiny_cfg(tmp_path, "experiment=spt/listops", "attn=full", f"pretrained='{pretrained_run}'")
    with pytest.raises(ConfigError, match="stage=spt pretrains its own encoder"):
        run_stage(cfg, tmp_path / "job")
    assert not (tmp_path / "job").exists()


def test_only_a_completed_pretraining_run_is_accepted(pretrained_run: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "checkpoints").mkdir()
    (copy / "checkpoints" / "last.ckpt").write_bytes((pretrained_run / "checkpoints" / "last.ckpt").read_bytes())
    record = json.loads((pretrained_run / "results.json").read_text())
    for status, message in (("running", "status is running; finish it first"),):
        (copy / "results.json").write_text(json.dumps({**record, "status": status}))
        cfg = tiny_cfg(tmp_path, "attn=full", f"pretrained='{copy}'")
        with pytest.raises(ConfigError, match=message):
            resolve_stage(cfg)
    (copy / "results.json").write_text(json.dumps({**record, "stage": "supervised"}))
    with pytest.raises(ConfigError, match="stage=supervised, not stage=pretrain"):
        resolve_stage(tiny_cfg(tmp_path, "attn=full", f"pretrained='{copy}'"))
    with pytest.raises(ConfigError, match="no such run dir or .ckpt"):
        resolve_stage(tiny_cfg(tmp_path, "attn=full", f"pretrained='{tmp_path / 'nowhere'}'"))


# -- causal -------------------------------------------------------------------------------------------------------
def test_causal_support_is_declared_by_each_attention() -> None:
    for name in ATTENTIONS.names():
        cls = ATTENTIONS.get(name)
        if cls.supports_causal:
            continue
        kwargs = {}
        if cls.takes_selector:
            from lra_bench.registry import build_selector

            kwargs["selector"] = build_selector("segment_means")
        attention = build_attention(name, head_dim=8, num_heads=2, seq_len=32, **kwargs)
        with pytest.raises(ValueError, match="has no causal form"):
            attention.set_causal(True)
    assert [n for n in ATTENTIONS.names() if ATTENTIONS.get(n).supports_causal] == ["full", "local"]


def test_causal_full_attention_matches_a_masked_softmax_oracle() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 9, 4) for _ in range(3))
    mask = torch.arange(9)[None, :] < torch.tensor([[9], [6]])
    attention = FullAttention(4, 2, 9)
    attention.set_causal(True)
    out = attention(q, k, v, mask)
    qn, kn, vn, mn = (t.double().numpy() for t in (q, k, v, mask))
    scores = qn @ kn.swapaxes(-1, -2) / 2.0
    allowed = np.tril(np.ones((9, 9), dtype=bool))[None, None] & mn[:, None, None, :].astype(bool)
    weights = np.where(allowed, np.exp(scores - scores.max(-1, keepdims=True)), 0.0)
    expected = (weights / weights.sum(-1, keepdims=True)) @ vn
    assert np.allclose(out.double().numpy(), expected, atol=1e-5)
    later = v.clone()
    later[:, :, 5:] += 10.0  # changing the future never changes the past
    assert torch.allclose(attention(q, k, later, mask)[:, :, :5], out[:, :, :5])
    rows = mask[:, None, :, None].to(out.dtype)  # the diagnostics' matrix zeroes pad rows (the wrapper zeroes them)
    assert torch.allclose(attention.implied_matrix(q, k, mask) @ v, out * rows, atol=1e-5)


def test_causal_is_refused_with_one_line_where_unsupported(tmp_path: Path) -> None:
    proc = run_cli([*TINY, "attn=nystrom", "stage=pretrain", "objective=causal"], tmp_path, check=False)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert lines == [
        "error: objective=causal: attn=nystrom has no causal form (every query would see later keys through its "
        "approximation); use objective=mlm, or one of attn=full attn=local"
    ]
    assert not list((tmp_path / "outputs").rglob("last.ckpt"))  # refused before anything ran


def test_causal_pretraining_runs_for_full(tmp_path: Path) -> None:
    cfg = tiny_cfg(tmp_path, "attn=full", "stage=pretrain", "objective=causal", "trainer.max_steps=2")
    record = run_stage(cfg, tmp_path / "causal")
    assert record["status"] == "completed" and record["pretraining"] == "causal"
    assert record["pretrain"]["objective"] == "causal" and record["pretrain"]["mask_ratio"] is None
    assert record["pretrain"]["curve"] and record["metrics"]["val_acc"] is None


# -- records and the leaderboard ----------------------------------------------------------------------------------
def test_pretraining_record_says_stage_objective_ratio_and_curve(pretrained_run: Path) -> None:
    record = json.loads((pretrained_run / "results.json").read_text())
    assert (record["stage"], record["pretraining"], record["pretrained"]) == ("pretrain", "mlm", None)
    pre = record["pretrain"]
    assert (pre["objective"], pre["mask_ratio"], pre["loss"], pre["mask_id"]) == ("mlm", 0.5, "ce", 17)
    assert [p["step"] for p in pre["curve"]] == [2, 4, 6]
    assert all(0 <= p["val_acc"] <= 1 and p["train_loss"] > 0 for p in pre["curve"])
    assert record["metrics"]["test_acc"] is None and record["metrics"]["val_acc"] is None
    assert "train split's inputs only" in record["data"]["split"]


def _record(path: Path, pretraining: str | None, stage_name: str, test_acc: float | None, seed: int = 0) -> None:
    from lra_bench.record import results

    record = results.empty_record()
    record.update(task="listops", attn="full", protocol="nystromformer", seed=seed, status="completed")
    record["metrics"].update(test_acc=test_acc, val_acc=test_acc)
    record["run"]["output_dir"] = str(path)
    if stage_name != "old":
        record.update(stage=stage_name, pretraining=pretraining)
    results.write_atomic(path / "results.json", record)


def test_leaderboard_keeps_spt_rows_apart_and_pretraining_runs_out(tmp_path: Path) -> None:
    from lra_bench.leaderboard.aggregate import find_results as find
    from lra_bench.leaderboard.aggregate import group_rows, load_records

    _record(tmp_path / "scratch0", "none", "supervised", 0.30)
    _record(tmp_path / "scratch1", None, "old", 0.32, seed=1)  # a record from before SPT: counts as none
    _record(tmp_path / "spt0", "mlm", "supervised", 0.50)
    _record(tmp_path / "causal0", "causal", "supervised", 0.40)
    _record(tmp_path / "pre0", "mlm", "pretrain", None)
    records, bad = load_records(find([tmp_path]))
    assert not bad
    rows, superseded = group_rows(records)
    got = {r["pretraining"]: (r["n"], r["test_acc_mean"]) for r in rows}
    assert got == {"none": (2, pytest.approx(31.0)), "mlm": (1, pytest.approx(50.0)), "causal": (1, 40.0)}
    assert not superseded  # the pretraining record (seed 0) never competes with the seed-0 fine-tunes


# -- the study's numbers and its section in docs/results.md ----------------------------------------------------
def test_the_studies_start_run_py_where_it_lies() -> None:
    """The spt and locality studies run `python run.py …` in their repository folder (the spt study once ran it in
    lra_bench/, where there is no run.py: every arm failed before it trained)."""
    from lra_bench.locality import runs
    from lra_bench.reports import spt_study

    for study in (spt_study, runs):
        assert (study.REPO / "run.py").is_file(), study.__name__


def test_study_summary_and_results_section() -> None:
    from lra_bench.reports.results_doc import keep_section, markers, spt_body, with_section
    from lra_bench.reports.spt_study import render_markdown, summarize

    rng = np.random.default_rng(0)
    rows = [
        {"attn": a, "arm": arm, "seed": s, "test_acc": float(rng.uniform(0.2, 0.6)), "val_acc": 0.5, "best_step": 100,
         "pretrain_masked_acc": 0.4 if arm == "spt" else None, "wall_s": 1.0}
        for a in ("full", "nystrom") for s in (0, 1, 2) for arm in ("scratch", "spt")
    ]  # fmt: skip
    summary = {e["attn"]: e for e in summarize(rows)}
    for attn in ("full", "nystrom"):
        acc = {
            arm: np.array([r["test_acc"] for r in rows if r["attn"] == attn and r["arm"] == arm])
            for arm in ("scratch", "spt")
        }
        e = summary[attn]
        assert math.isclose(e["spt_mean"], acc["spt"].mean()) and math.isclose(
            e["scratch_std"], acc["scratch"].std(ddof=1)
        )
        assert np.allclose(e["diff_per_seed"], acc["spt"] - acc["scratch"])
        assert math.isclose(e["diff_mean"], (acc["spt"] - acc["scratch"]).mean())
    study = {
        "settings": {"train_examples": 1000, "total_steps": 600, "pretrain_steps": 300},
        "summary": summarize(rows), "rows": rows, "env": {"hardware": {}, "git_commit": "abc"},
        "uptime_before": "load 1", "uptime_after": "load 2", "command": "python -m lra_bench.reports.spt_study",
    }  # fmt: skip
    doc = "# Results\n\n## Benchmark\n\nnumbers\n"
    SPT_BEGIN, SPT_END = markers("spt_study")
    once = with_section(doc, "spt_study", spt_body([study]))
    assert once.startswith(doc.rstrip("\n")) and once.count(SPT_BEGIN) == 1 and render_markdown(study, h="##") in once
    rows[0]["test_acc"] = 0.99
    study["summary"] = summarize(rows)
    twice = with_section(once + "\n## After\n", "spt_study", spt_body([study]))
    assert twice.count(SPT_BEGIN) == twice.count(SPT_END) == 1 and "| 99.0 |" in twice and twice.endswith("## After\n")
    rerendered = keep_section("# Results\n\n## Benchmark\n\nnew numbers\n", twice, "spt_study")  # `make results`
    assert "new numbers" in rerendered and rerendered.count(SPT_BEGIN) == 1 and "| 99.0 |" in rerendered
