"""Attention inputs captured from a model: q, k, v of every attention layer and head, on real sequences.

* `trained`: a checkpoint `<run>/checkpoints/*.ckpt`, rebuilt from the run's own `<run>/.hydra/config.yaml` by the
  code that trained it, run in eval mode on the longest validation sequences of its task (the diagnostics' probe,
  `lra_bench.diagnostics.callback.build_probe`).
* `random_model`: the same architecture freshly initialised (seeded): from the checkpoint's run config when one is
  given (trained and random then differ only in the weights, on the same sequences), otherwise from
  `conf/config.yaml` with `model_overrides`, fed seeded random token ids (no dataset needed).

A forward pre-hook on every `Attention` module records exactly what the operator sees, after the block's
projections; each (sequence, layer, head) is one instance, cut to its real tokens (at most `max_len`). The study
compares every selector against exact softmax on these q, k, whatever attention the model was trained with.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from lra_bench.config.setup import setup
from lra_bench.diagnostics.callback import DiagnosticsCallback, build_probe
from lra_bench.record.checkpoint_file import load_checkpoint
from lra_bench.record.reader import typed
from lra_bench.run.build import build_datamodule, build_model
from models.attention.base import Attention


@dataclass
class Instance:
    """One attention problem: q, k, v `[n, d]` (fp64) and where it came from."""

    source: str
    name: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    seed: int | None = None  # synthetic instances are tied to one seed


def run_config(ckpt: Path) -> DictConfig:
    """The training run's config (`<run>/.hydra/config.yaml`, two levels above the checkpoint)."""
    path = ckpt.resolve().parent.parent / ".hydra" / "config.yaml"
    if not path.exists():
        raise FileNotFoundError(f"approx.ckpt={ckpt}: expected the run config at {path}")
    cfg = OmegaConf.load(path)
    assert isinstance(cfg, DictConfig)
    return cfg


def run_metrics(ckpt: Path) -> dict[str, Any]:
    """The training run's validation accuracy and majority-class share (its results.json), when recorded."""
    path = ckpt.resolve().parent.parent / "results.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    read = typed(record)
    return {
        "run_val_acc": read.metrics.val_acc,
        "run_majority_share": read.data.get("majority_share"),
        "run_status": record.get("status"),
    }


def load_weights(model: torch.nn.Module, ckpt: Path) -> int:
    """Load a Lightning checkpoint's `model.*` weights; returns its global step."""
    state = load_checkpoint(ckpt)
    weights = {k.removeprefix("model."): v for k, v in state["state_dict"].items() if k.startswith("model.")}
    model.load_state_dict(weights, strict=True)
    return int(state.get("global_step", 0))


def trained_model(ckpt: Path, data_dir: str | None) -> tuple[DictConfig, Any, torch.nn.Module, int]:
    """The run's config, its task's data module (read or regenerated in `data_dir` when given, not in the run's), the
    model with the checkpoint's weights and its global step."""
    cfg = run_config(ckpt)
    if data_dir:
        cfg.data_dir = str(data_dir)
    dm = build_datamodule(cfg)
    dm.prepare_data()
    dm.setup()
    model = build_model(cfg, dm)
    return cfg, dm, model, load_weights(model, ckpt)


def capture(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> list[list[tuple]]:
    """(q, k, v, mask) of every Attention call, grouped by layer (module order)."""
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    seen: list[list[tuple]] = [[] for _ in layers]

    def hook(index: int):
        def fn(module, args):
            q, k, v, mask = args[:4]
            seen[index].append((q.detach(), k.detach(), v.detach(), None if mask is None else mask.detach()))

        return fn

    handles = [layer.register_forward_pre_hook(hook(i)) for i, layer in enumerate(layers)]
    try:
        model.eval()
        with torch.no_grad():
            model(batch)
    finally:
        for h in handles:
            h.remove()
    return seen


def instances_from(source: str, seen: list[list[tuple]], max_len: int, min_len: int) -> list[Instance]:
    out = []
    for layer, calls in enumerate(seen):
        for call, (q, k, v, mask) in enumerate(calls):
            for b in range(q.shape[0]):
                real = torch.arange(q.shape[2]) if mask is None else mask[b].nonzero().flatten()
                real = real[:max_len]
                if real.numel() < min_len:
                    continue
                for h in range(q.shape[1]):
                    tag = f"seq{b}" + (f"/tower{call}" if len(calls) > 1 else "")
                    out.append(
                        Instance(
                            source=source,
                            name=f"{tag}/layer{layer}/head{h}",
                            q=q[b, h, real].double(),
                            k=k[b, h, real].double(),
                            v=v[b, h, real].double(),
                        )
                    )
    return out


def longest_real(batch: dict[str, torch.Tensor], max_len: int) -> int:
    """The most real tokens of any sequence of `batch` (up to `max_len`): what `min_len` is compared with."""
    lengths = batch["mask"].sum(-1) if "mask" in batch else torch.tensor([batch["input_ids"].shape[1]])
    return int(min(int(lengths.max()), max_len))


def model_instances(
    ckpt: str | None, settings: dict[str, Any], compose_main: Any, seed: int
) -> tuple[dict[str, list[Instance]], dict[str, Any]]:
    """Instances for `trained` (when a checkpoint is given) and `random_model`, plus provenance notes."""
    sequences, max_len, min_len = int(settings["sequences"]), int(settings["max_len"]), int(settings["min_len"])
    out: dict[str, list[Instance]] = {}
    info: dict[str, Any] = {}
    if ckpt:
        path = Path(ckpt).expanduser()
        cfg, dm, model, step = trained_model(path, settings.get("data_dir"))
        batch = build_probe(dm, sequences, max_len)
        if batch is None:
            raise RuntimeError(f"approx.ckpt={ckpt}: the run's task has no validation sequences")
        out["trained"] = instances_from("trained", capture(model, batch), max_len, min_len)
        info["trained"] = {
            "ckpt": str(path),
            "global_step": step,
            **run_metrics(path),
            "task": str(cfg.task.name),
            "attn": str(cfg.attn.name),
            "sequences": int(batch["input_ids"].shape[0]),
            "data": f"the {sequences} longest validation sequences, cut to {max_len} tokens",
            "longest_real_tokens": longest_real(batch, max_len),
        }
        torch.manual_seed(seed)
        fresh = build_model(cfg, dm)
        out["random_model"] = instances_from("random_model", capture(fresh, batch), max_len, min_len)
        info["random_model"] = {
            **{k: v for k, v in info["trained"].items() if not k.startswith("run_")},
            "ckpt": None,
            "global_step": 0,
            "init_seed": seed,
        }
        return out, info
    cfg = compose_main(list(settings.get("model_overrides") or []))
    task = cfg.task
    torch.manual_seed(seed)
    model = build_model(cfg, task)  # no data is read: the task node holds the shape a data module gives
    n = min(max_len, int(task.seq_len))
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, int(task.vocab_size), (sequences, n), generator=gen)
    batch = {"input_ids": ids, "mask": torch.ones(sequences, n, dtype=torch.bool)}
    if task.dual:
        batch.update(input_ids_2=ids.flip(0), mask_2=batch["mask"])
    out["random_model"] = instances_from("random_model", capture(model, batch), max_len, min_len)
    info["random_model"] = {
        "ckpt": None,
        "task": str(task.name),
        "attn": str(cfg.attn.name),
        "sequences": sequences,
        "data": "seeded random token ids (no checkpoint given)",
        "longest_real_tokens": longest_real(batch, max_len),
        "init_seed": seed,
        "overrides": list(settings.get("model_overrides") or []),
    }
    return out, info


def measure_checkpoint(
    ckpt: Path, threads: int, sequences: int, max_len: int, rank_tol: float, data_dir: str | None = None
) -> dict[str, Any]:
    """Per (sequence, layer, head) metrics of the checkpoint's own attention against exact softmax attention, on the
    probe (the diagnostics' measurement, `DiagnosticsCallback.compute`) on `threads` CPU threads, plus what the
    checkpoint and run are. A reproduction's `approx.json` (`lra_bench.reproduction_approx`) is made from it."""
    torch.set_num_threads(threads)
    setup()
    cfg, dm, model, step = trained_model(ckpt, data_dir)
    diag_cfg = {"probe_size": sequences, "max_len": max_len, "rank_tol": rank_tol, "heads": None, "layers": None}
    callback = DiagnosticsCallback(diag_cfg, dm)
    diag = callback.compute(model, torch.device("cpu"))
    if diag is None:
        raise RuntimeError(f"{ckpt}: no measurement (no validation sequences, or an attention without implied_matrix)")
    return {
        "diag": diag,
        "step": step,
        "attn": str(cfg.attn.name),
        "task": str(cfg.task.name),
        "run": run_metrics(ckpt),
        "threads": torch.get_num_threads(),
    }
