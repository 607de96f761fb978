"""Heads on the encoder: one tower (most tasks), the dual-tower retrieval head, and the per-token LM head.

Dual tower: one shared encoder embeds both documents into u and v; `nli` classifies [u, v, u·v, u−v]
(Nyströmformer/xformers/S4), `concat` classifies [u, v] (what the official LRA JAX training actually ran).

`LanguageModel` is the self-pretraining network: the same `Encoder` with a separate linear head on every
position (token logits, or one value per position for pixel regression). The head is dropped when fine-tuning;
the encoder — the attribute `encoder` in every network here — is what carries over.
"""

from __future__ import annotations

import torch
from torch import nn

from models.encoder import Encoder

INTERACTIONS = {"nli": 4, "concat": 2}


class Classifier(nn.Module):
    def __init__(self, encoder: Encoder, dim: int, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.head(self.encoder(batch["input_ids"], batch.get("mask")))


class DualClassifier(nn.Module):
    def __init__(self, encoder: Encoder, dim: int, hidden: int, num_classes: int, interaction: str = "nli") -> None:
        super().__init__()
        if interaction not in INTERACTIONS:
            raise ValueError(f"model.interaction={interaction!r}: expected one of {sorted(INTERACTIONS)}")
        self.encoder, self.interaction = encoder, interaction
        self.head = nn.Sequential(
            nn.Linear(INTERACTIONS[interaction] * dim, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
        )

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        u = self.encoder(batch["input_ids"], batch.get("mask"))
        v = self.encoder(batch["input_ids_2"], batch.get("mask_2"))
        feats = [u, v, u * v, u - v] if self.interaction == "nli" else [u, v]
        return self.head(torch.cat(feats, dim=-1))


class LanguageModel(nn.Module):
    """Encoder + a linear head per position: `batch["input_ids"] [B, N]` → `[B, N, outputs]` (CLS position
    dropped), for masked-token or next-token self-pretraining (`lra_bench.run.pretrain`)."""

    def __init__(self, encoder: Encoder, dim: int, outputs: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.lm_head = nn.Linear(dim, outputs)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        x, _ = self.encoder.features(batch["input_ids"], batch.get("mask"))
        if self.encoder.use_cls:
            x = x[:, 1:]
        return self.lm_head(x)


#: a task's classifier: one tower, or two towers sharing the encoder
TaskNetwork = Classifier | DualClassifier
