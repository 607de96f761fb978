"""Approximation diagnostics at validation time, on a fixed probe batch (see `lra_bench.diagnostics.metrics`).

The probe is the `probe_size` longest validation sequences (by real tokens, counted up to `max_len`; ties:
the earliest), cut to `max_len` tokens, chosen once at the first validation — the longest, because the
approximation question is about long sequences and the first few of a split can be a dozen tokens. At every
`every_n_validations`-th validation (and at any validation that improves val/acc, so that the best-val
record always has them) the model runs the probe in eval mode under `no_grad`; a forward hook on every
`MultiHeadAttention` captures its input, q, k, v are recomputed with the block's own `project`, and each
selected layer/head is compared in fp64 against exact softmax attention.

It never changes training: no gradients, eval mode (restored afterwards), no draw from the training RNG
(the global CPU/CUDA RNG states are saved and restored around it; selectors draw from their own
generators, which in eval mode are freshly seeded per call; GPA's codebook and Performer's features never
change in eval mode). Results go to every Lightning logger under `diag/...` (per layer/head and the summary)
and to the result record through two attributes the run's record owner reads (`lra_bench.run.recorder`):
`latest` at each run, `best` when val/acc improves; `on_update` (the owner's write) is called after each run, so
`results.json` shows them while the run trains.
Each head keeps its per-sequence values; head and probe summaries are medians plus the pooled ratio
Σerr/Σfloor, with heads whose Eckart–Young floor is below 1% of ‖A‖_F flagged and listed, not averaged in
(`lra_bench.diagnostics.metrics.summary_metrics`). The rank budget is the effective one (see `effective_rank`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from omegaconf import DictConfig

from lra_bench.diagnostics import LOCALITY_KEYS
from lra_bench.diagnostics.metrics import head_metrics, summary_metrics
from lra_bench.kit.plain import plain_dict
from lra_bench.kit.say import say
from models.attention.base import Attention
from models.encoder import MultiHeadAttention

DEFAULTS: dict[str, Any] = {
    "every_n_validations": 1,
    "max_len": 1024,
    "probe_size": 2,
    "probe_scan": 512,
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
    "ey_ratio_pooled",
    "rank_budget",
    "rank_a",
    "rank_a_hat",
    "stable_rank_a",
    "block_coherence",
    "coherence",
    "target_residual",
    "target_output_residual",
    *(f"{key}{suffix}" for key in LOCALITY_KEYS for suffix in ("", "_exact")),
)


def preserved_rng() -> contextlib.AbstractContextManager[None]:
    """`torch.random.fork_rng` over the CPU stream and the CUDA devices already in use: the global RNG streams are
    restored on exit. (Not its default `devices=None`, which would initialise CUDA on a CPU run and warn on
    multi-GPU nodes.)"""
    in_use = torch.cuda.is_available() and torch.cuda.is_initialized()
    return torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if in_use else [])


def rank_budget(attention: Any, n: int) -> int | None:
    """The nominal rank the method spends at length n: landmarks, features or projection rows (None = full)."""
    value = attention.rank_budget(n)
    return None if value is None else int(value)


def effective_rank(attention: Any, nominal: int | None, b: int, h: int) -> int | None:
    """The rank the last call really used for sequence `b`, head `h`: landmark attentions record it as
    `last_rank [B, H]` (valid landmarks — GPA's codebook clusters that got tokens, pivots before the stopping
    rule; the spectral core's kept eigenvalues), capped by the nominal budget; else the nominal budget."""
    used = getattr(attention, "last_rank", None)
    if used is None:
        return nominal
    value = int(used[min(b, used.shape[0] - 1), min(h, used.shape[1] - 1)])
    return value if nominal is None else min(value, nominal)


def attention_modules(model: torch.nn.Module) -> list[MultiHeadAttention]:
    return [m for m in model.modules() if isinstance(m, MultiHeadAttention)]


def exposes_implied_matrix(attention: Attention) -> bool:
    """Whether the attention overrides the `implied_matrix` hook (every attention in this repository does; a user's
    plugin may not, and then its runs simply have no diagnostics)."""
    return type(attention).implied_matrix is not Attention.implied_matrix


def split_lengths(split: Any) -> np.ndarray:
    """Real tokens of every sequence of a split (both towers added for two-tower tasks): read from the Arrow
    columns when the split has them (no token ids loaded), else from the rows."""
    table = getattr(split, "table", None)
    names = set(getattr(table, "column_names", None) or ())
    if table is not None and "length" in names:
        cols = [np.asarray(table["length"], dtype=np.int64)]
        if "length_2" in names:
            cols.append(np.asarray(table["length_2"], dtype=np.int64))
        return np.sum(cols, axis=0)
    rows = split.__getitems__(list(range(len(split))))
    total = np.asarray(rows["length"], dtype=np.int64)
    return total + np.asarray(rows["length_2"], dtype=np.int64) if "length_2" in rows else total


def longest_indices(lengths: np.ndarray, size: int, max_len: int) -> list[int]:
    """The `size` longest (lengths counted up to `max_len`; ties: the earliest), in their original order."""
    capped = np.minimum(lengths, max_len)
    order = np.argsort(-capped, kind="stable")[:size]
    return sorted(int(i) for i in order)


def cut(batch: dict[str, torch.Tensor], max_len: int) -> dict[str, torch.Tensor]:
    return {
        key: value[:, :max_len] if key.startswith(("input_ids", "mask")) and value.dim() == 2 else value
        for key, value in batch.items()
    }


def build_probe(datamodule: Any, size: int, max_len: int, scan: int = 512) -> dict[str, torch.Tensor] | None:
    """The `size` longest validation sequences (see the module docstring), cut to `max_len` tokens (None when
    there is no val split). A data module without cached splits is read through its val loader: the longest of
    its first `scan` sequences."""
    splits = getattr(datamodule, "splits", None) or {}
    val = splits.get("val")
    if val is not None and hasattr(datamodule, "collate"):
        if len(val) == 0:
            return None
        chosen = longest_indices(split_lengths(val), size, max_len)
        return cut(datamodule.collate(val.__getitems__(chosen)), max_len)
    with preserved_rng():  # iterating a DataLoader draws a base seed from the global RNG
        rows: list[dict[str, torch.Tensor]] = []
        for batch in datamodule.val_dataloader():
            rows.append(batch)
            if sum(b["input_ids"].shape[0] for b in rows) >= scan:
                break
    if not rows:
        return None
    batch = {key: torch.cat([b[key] for b in rows])[:scan] for key in rows[0] if torch.is_tensor(rows[0][key])}
    lengths = sum(batch[key].sum(-1) for key in ("mask", "mask_2") if key in batch)
    chosen = longest_indices(np.asarray(lengths), size, max_len)
    return cut({key: value[chosen] for key, value in batch.items()}, max_len)


class DiagnosticsCallback(pl.Callback):
    def __init__(
        self,
        diag_cfg: DictConfig | dict[str, Any],
        datamodule: Any,
        on_update: Callable[[], None] | None = None,
    ) -> None:
        cfg = plain_dict(diag_cfg)
        self.cfg = {**DEFAULTS, **{k: v for k, v in cfg.items() if v is not None or k in ("heads", "layers")}}
        self.datamodule, self.on_update = datamodule, on_update
        self.latest: dict[str, Any] | None = None  # the last measurement
        self.best: dict[str, Any] | None = None  # the measurement at the best val/acc so far
        self.validations = 0
        self.best_val: float | None = None
        self._probe: dict[str, torch.Tensor] | None = None
        self._warned = False

    # -- checkpointed state (so a resumed run keeps its best-val diagnostics) ----------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"validations": self.validations, "best_val": self.best_val, "best": self.best}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.validations = int(state_dict.get("validations", 0))
        self.best_val = state_dict.get("best_val")
        if state_dict.get("best") is not None:
            self.best = state_dict["best"]

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
        self.latest = diag
        if improved:
            self.best = diag
        self.log_to(trainer, diag)
        if self.on_update is not None:
            self.on_update()

    # -- the measurement --------------------------------------------------------------------------------
    def probe(self, device: torch.device) -> dict[str, torch.Tensor] | None:
        if self._probe is None:
            self._probe = build_probe(
                self.datamodule, int(self.cfg["probe_size"]), int(self.cfg["max_len"]), int(self.cfg["probe_scan"])
            )
        if self._probe is None:
            return None
        return {key: value.to(device) for key, value in self._probe.items()}

    def compute(self, model: torch.nn.Module, device: torch.device) -> dict[str, Any] | None:
        """Diagnostics of `model` on the probe; the model's mode and the global RNG are left as found."""
        batch = self.probe(device)
        if batch is None:
            return None
        modules = attention_modules(model)
        missing = sorted({type(m.attention).__name__ for m in modules if not exposes_implied_matrix(m.attention)})
        if missing:  # a user's attention without the diagnostics hook: say so once, never fail the run for it
            if not self._warned:
                say(f"[lra-bench] diagnostics skipped: {', '.join(missing)} does not implement implied_matrix")
                self._warned = True
            return None
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
        rows = [s for layer in layers_out for h in layer["heads"] for s in h["sequences"]]
        flagged = [
            {"layer": layer["layer"], "head": h["head"], "sequence": i, "ey_floor": s["ey_floor"]}
            for layer in layers_out
            for h in layer["heads"]
            for i, s in enumerate(h["sequences"])
            if s.get("floor_flagged")
        ]
        lengths = batch["mask"].sum(-1).tolist() if "mask" in batch else [int(batch["input_ids"].shape[1])]
        return {
            "probe": {
                "sequences": int(batch["input_ids"].shape[0]),
                "max_len": int(self.cfg["max_len"]),
                "lengths": [int(x) for x in lengths],
                "rule": "the longest validation sequences, cut to max_len, fixed at the first validation",
            },
            "summary": summary_metrics(rows),
            "floor_flagged": flagged,
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
                nominal = rank_budget(attention, n)
                for h in head_ids:
                    sub = (slice(None), real)
                    values = head_metrics(
                        q[b, h][real],
                        k[b, h][real],
                        v[b, h][real],
                        a_hat[b, h][real][sub],
                        effective_rank(attention, nominal, b, h),
                        float(self.cfg["rank_tol"]),
                        None if target is None else tuple(t[b, h][real][sub] for t in target),
                    )
                    per_head[h].append({**values, "rank_budget_nominal": nominal})
        return {
            "layer": index,
            "extra": extra,
            "heads": [{"head": h, **summary_metrics(per_head[h]), "sequences": per_head[h]} for h in head_ids],
        }

    def log_to(self, trainer: pl.Trainer, diag: dict[str, Any]) -> None:
        def logged(values: dict[str, Any], prefix: str) -> dict[str, float]:
            return {f"{prefix}/{key}": float(values[key]) for key in LOGGED if values.get(key) is not None}

        metrics = logged(diag["summary"], "diag")
        for layer in diag["layers"]:
            prefix = f"diag/L{layer['layer']}"
            metrics |= {f"{prefix}/{key}": float(value) for key, value in layer["extra"].items()}
            for head in layer["heads"]:
                metrics |= logged(head, f"{prefix}/H{head['head']}")
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
