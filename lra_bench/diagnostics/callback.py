"""Approximation diagnostics at validation time, on a fixed probe batch (see `lra_bench.diagnostics.metrics`).

The probe is the first `probe_size` validation sequences, cut to `max_len` tokens, built once. At every
`every_n_validations`-th validation (and at any validation that improves val/acc, so that the best-val
record always has them) the model runs the probe in eval mode under `no_grad`; a forward hook on every
`MultiHeadAttention` captures its input, q, k, v are recomputed with the block's own `project`, and each
selected layer/head is compared in fp64 against exact softmax attention.

It never changes training: no gradients, eval mode (restored afterwards), no draw from the training RNG
(the global CPU/CUDA RNG states are saved and restored around it; selectors draw from their own
generators, which in eval mode are freshly seeded per call; GPA's codebook and Performer's features never
change in eval mode). Results go to every Lightning logger under `diag/...` (per layer/head and means)
and into the result record: `record["diagnostics"]["latest"]` at each run, `["best"]` when val/acc improves.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf

from lra_bench.diagnostics.metrics import head_metrics, mean_metrics
from lra_bench.record import results
from models.encoder import MultiHeadAttention

DEFAULTS: dict[str, Any] = {
    "every_n_validations": 1,
    "max_len": 1024,
    "probe_size": 2,
    "heads": None,
    "layers": None,
    "rank_tol": 1.0e-3,
}
#: per-head metrics also logged to the loggers (the record keeps every metric)
LOGGED = (
    "matrix_residual",
    "output_residual",
    "ey_floor",
    "ey_ratio",
    "rank_a",
    "rank_a_hat",
    "stable_rank_a",
    "block_coherence",
    "coherence",
    "target_residual",
    "target_output_residual",
)


def preserved_rng() -> contextlib.AbstractContextManager[None]:
    """`torch.random.fork_rng` over the CPU stream and the CUDA devices already in use: the global RNG streams are
    restored on exit. (Not its default `devices=None`, which would initialise CUDA on a CPU run and warn on
    multi-GPU nodes.)"""
    in_use = torch.cuda.is_available() and torch.cuda.is_initialized()
    return torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if in_use else [])


def rank_budget(attention: Any, n: int) -> int | None:
    """The rank the method spends at length n: landmarks, features or projection rows (None = full)."""
    for name in ("landmark_count", "rank_budget"):
        fn = getattr(attention, name, None)
        if callable(fn):
            return int(fn(n))
    return None


def attention_modules(model: torch.nn.Module) -> list[MultiHeadAttention]:
    return [m for m in model.modules() if isinstance(m, MultiHeadAttention)]


def build_probe(datamodule: Any, size: int, max_len: int) -> dict[str, torch.Tensor] | None:
    """The first `size` validation sequences, cut to `max_len` tokens (None when there is no val split)."""
    splits = getattr(datamodule, "splits", None) or {}
    val = splits.get("val")
    if val is not None and hasattr(datamodule, "collate"):
        count = min(size, len(val))
        if count == 0:
            return None
        batch = datamodule.collate(val.__getitems__(list(range(count))))
    else:
        with preserved_rng():  # iterating a DataLoader draws a base seed from the global RNG
            rows: list[dict[str, torch.Tensor]] = []
            for batch in datamodule.val_dataloader():
                rows.append(batch)
                if sum(b["input_ids"].shape[0] for b in rows) >= size:
                    break
        if not rows:
            return None
        batch = {key: torch.cat([b[key] for b in rows])[:size] for key in rows[0] if torch.is_tensor(rows[0][key])}
    out = {}
    for key, value in batch.items():
        if key.startswith(("input_ids", "mask")) and value.dim() == 2:
            value = value[:, :max_len]
        out[key] = value
    return out


class DiagnosticsCallback(pl.Callback):
    def __init__(self, diag_cfg: DictConfig | dict[str, Any], datamodule: Any, record: dict[str, Any]) -> None:
        cfg = OmegaConf.to_container(diag_cfg, resolve=True) if isinstance(diag_cfg, DictConfig) else dict(diag_cfg)
        self.cfg = {**DEFAULTS, **{k: v for k, v in cfg.items() if v is not None or k in ("heads", "layers")}}
        self.datamodule, self.record = datamodule, record
        self.validations = 0
        self.best_val: float | None = None
        self._probe: dict[str, torch.Tensor] | None = None

    # -- checkpointed state (so a resumed run keeps its best-val diagnostics) ----------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"validations": self.validations, "best_val": self.best_val, "best": self.record["diagnostics"]["best"]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.validations = int(state_dict.get("validations", 0))
        self.best_val = state_dict.get("best_val")
        if state_dict.get("best") is not None:
            self.record["diagnostics"]["best"] = state_dict["best"]

    # -- the hook ---------------------------------------------------------------------------------------
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self.validations += 1
        value = trainer.callback_metrics.get("val/acc")
        val_acc = None if value is None else float(value)
        improved = val_acc is not None and (self.best_val is None or val_acc > self.best_val)
        scheduled = (self.validations - 1) % max(1, int(self.cfg["every_n_validations"])) == 0
        if improved:
            self.best_val = val_acc
        if not (scheduled or improved) or not trainer.is_global_zero:
            return
        diag = self.compute(getattr(pl_module, "model", pl_module), pl_module.device)
        if diag is None:
            return
        diag.update(step=int(trainer.global_step), val_acc=val_acc)
        self.record["diagnostics"]["latest"] = diag
        if improved:
            self.record["diagnostics"]["best"] = diag
        self.log_to(trainer, diag)
        output_dir = (self.record.get("run") or {}).get("output_dir")
        if output_dir:
            results.write_atomic(Path(output_dir) / results.FILENAME, self.record)

    # -- the measurement --------------------------------------------------------------------------------
    def probe(self, device: torch.device) -> dict[str, torch.Tensor] | None:
        if self._probe is None:
            self._probe = build_probe(self.datamodule, int(self.cfg["probe_size"]), int(self.cfg["max_len"]))
        if self._probe is None:
            return None
        return {key: value.to(device) for key, value in self._probe.items()}

    def compute(self, model: torch.nn.Module, device: torch.device) -> dict[str, Any] | None:
        """Diagnostics of `model` on the probe; the model's mode and the global RNG are left as found."""
        batch = self.probe(device)
        if batch is None:
            return None
        modules = attention_modules(model)
        layers = self.cfg["layers"]
        chosen = [i for i in range(len(modules)) if layers is None or i in set(layers)]
        captured: dict[int, list[tuple[torch.Tensor, torch.Tensor | None]]] = {i: [] for i in chosen}

        def hook(index: int):
            def fn(module, args, kwargs, output):
                x = args[0]
                mask = args[1] if len(args) > 1 else kwargs.get("mask")
                captured[index].append((x.detach(), None if mask is None else mask.detach()))

            return fn

        was_training = model.training
        handles = [modules[i].register_forward_hook(hook(i), with_kwargs=True) for i in chosen]
        try:
            with preserved_rng(), torch.no_grad():
                model.eval()
                model(batch)
                layers_out = [self.layer_metrics(i, modules[i], captured[i]) for i in chosen]
        finally:
            for handle in handles:
                handle.remove()
            model.train(was_training)
        heads = [h for layer in layers_out for h in layer["heads"]]
        return {
            "probe": {"sequences": int(batch["input_ids"].shape[0]), "max_len": int(self.cfg["max_len"])},
            "mean": mean_metrics([{k: v for k, v in h.items() if k != "head"} for h in heads]),
            "layers": layers_out,
        }

    def layer_metrics(
        self, index: int, mha: MultiHeadAttention, inputs: list[tuple[torch.Tensor, torch.Tensor | None]]
    ) -> dict[str, Any]:
        attention = mha.attention
        heads = self.cfg["heads"]
        head_ids = [h for h in range(mha.num_heads) if heads is None or h in set(heads)]
        per_head: dict[int, list[dict[str, Any]]] = {h: [] for h in head_ids}
        extra: dict[str, float] = {}
        for x, mask in inputs:
            q, k, v = mha.project(x)
            if mask is not None:
                v = v * mask[:, None, :, None].to(v.dtype)
            a_hat = attention.implied_matrix(q, k, mask)
            pair_fn = getattr(attention, "target_pair", None)
            target = pair_fn(q, k, mask) if callable(pair_fn) else None
            extra.update(attention.extra_diagnostics())
            for b in range(x.shape[0]):
                real = torch.ones(x.shape[1], dtype=torch.bool, device=x.device) if mask is None else mask[b]
                n = int(real.sum())
                if n == 0:
                    continue
                budget = rank_budget(attention, n)
                for h in head_ids:
                    sub = (slice(None), real)
                    per_head[h].append(
                        head_metrics(
                            q[b, h][real],
                            k[b, h][real],
                            v[b, h][real],
                            a_hat[b, h][real][sub],
                            budget,
                            float(self.cfg["rank_tol"]),
                            None if target is None else tuple(t[b, h][real][sub] for t in target),
                        )
                    )
        return {
            "layer": index,
            "extra": extra,
            "heads": [{"head": h, **mean_metrics(per_head[h])} for h in head_ids],
        }

    def log_to(self, trainer: pl.Trainer, diag: dict[str, Any]) -> None:
        metrics: dict[str, float] = {}
        for key in LOGGED:
            if diag["mean"].get(key) is not None:
                metrics[f"diag/{key}"] = float(diag["mean"][key])
        for layer in diag["layers"]:
            prefix = f"diag/L{layer['layer']}"
            for key, value in layer["extra"].items():
                metrics[f"{prefix}/{key}"] = float(value)
            for head in layer["heads"]:
                for key in LOGGED:
                    if head.get(key) is not None:
                        metrics[f"{prefix}/H{head['head']}/{key}"] = float(head[key])
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
