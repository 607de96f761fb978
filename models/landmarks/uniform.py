"""Uniform landmarks: `m` distinct real tokens drawn uniformly at random, without replacement, per head.

Also home of what every randomised selector shares (`SeededSelector`): randomness comes from the selector's
own seeded `torch.Generator`, never the global RNG, so training, validation and diagnostics cannot perturb
each other. Draws are made on the CPU and moved to the device: the same seed gives the same landmarks on
every device.

* Training mode: one stream, advancing with every call, independent draws for every sequence and head; its
  state is saved with the model (`get_extra_state`), so a resumed run draws what an uninterrupted one would.
* Eval mode: every call draws from fresh generators seeded with `seed` (one per purpose, `stream`), laid out
  position-major and shared by the sequences of the batch. A sequence's landmarks are then a fixed function
  of (seed, head, its real positions): the same input gets the same landmarks whatever its batch-mates,
  its place in the batch or the amount of trailing padding — evaluation is reproducible and the training
  stream is never touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from models.cost import Flops, Params
from models.knobs import follows_run_seed
from models.landmarks.base import Landmarks, LandmarkSelector, gather_tokens

#: added to `seed` for the eval-mode generator, so eval draws differ from the first training draws
EVAL_SEED_OFFSET = 104_729


class SeededSelector(LandmarkSelector):
    """A selector with its own generator (see the module docstring); subclasses draw with `self.uniform`."""

    #: the landmarks are a data-independent random draw (spectral attention swaps such a selector for `hash`
    #: at inference, as its paper prescribes); data-driven selectors that merely sample a sketch set False
    randomized: bool = True

    def configure(self, cfg: Any) -> None:
        """Every seeded selector's config has a `seed` knob (`follows_run_seed`)."""
        self.seed = int(cfg.seed)
        self._train_generator = torch.Generator().manual_seed(self.seed)

    def uniform(self, shape: tuple[int, int, int], device: torch.device, stream: int = 0) -> torch.Tensor:
        """Uniform [0, 1) numbers `[B, H, L]` on `device` (see the module docstring for train vs eval)."""
        b, h, length = shape
        if self.training:
            return torch.rand(shape, generator=self._train_generator).to(device)
        gen = torch.Generator().manual_seed(self.seed + EVAL_SEED_OFFSET + 7919 * stream)
        return torch.rand((length, h), generator=gen).T.to(device).unsqueeze(0).expand(b, h, length)

    def get_extra_state(self) -> dict[str, Any]:
        return {"generator": self._train_generator.get_state()}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        if state and "generator" in state:
            self._train_generator.set_state(state["generator"].detach().to("cpu", torch.uint8))


class DataDrivenTokenSelector(SeededSelector):
    """A seeded selector whose landmarks are real tokens the data chooses (k-means++, RPCholesky, leverage,
    pivoted QR): its draws are weighted by the data (D², residuals, leverage) or only pick a sketch's rows, so it
    is not `randomized` (spectral attention keeps it at inference)."""

    token_landmarks = True
    randomized = False


def weighted_sample(
    u: torch.Tensor, eligible: torch.Tensor, m: int, weights: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`m` distinct positions per row of `u [..., N]` among `eligible [..., N]` (bool), uniformly or with
    probability proportional to `weights` (Efraimidis–Spirakis keys log(u)/w, top-m). Returns sorted
    indices `[..., m]` and validity (False where a row had fewer than m eligible positions)."""
    if weights is None:
        keys = u
    else:
        keys = torch.log(u.clamp_min(1e-30)) / weights.clamp_min(1e-30)
    keys = keys.masked_fill(~eligible, float("-inf"))
    m_eff = min(m, u.shape[-1])
    top, idx = keys.topk(m_eff, dim=-1)
    valid = torch.isfinite(top)
    order = torch.where(valid, idx, idx.new_full((), u.shape[-1])).argsort(dim=-1)  # valid ones first, sorted
    idx, valid = idx.gather(-1, order), valid.gather(-1, order)
    if m_eff < m:  # more landmarks than positions: pad with invalid slots
        pad = m - m_eff
        idx = torch.cat([idx, idx.new_zeros(*idx.shape[:-1], pad)], dim=-1)
        valid = torch.cat([valid, valid.new_zeros(*valid.shape[:-1], pad)], dim=-1)
    return torch.where(valid, idx, torch.zeros_like(idx)), valid


def token_landmarks(q: torch.Tensor, k: torch.Tensor, indices: torch.Tensor, valid: torch.Tensor) -> Landmarks:
    """Landmarks that are tokens: rows `indices [B, H, m]` of q and k."""
    return Landmarks(queries=gather_tokens(q, indices), keys=gather_tokens(k, indices), valid=valid, indices=indices)


def sample_real_tokens(
    selector: SeededSelector, mask: torch.Tensor, heads: int, m: int, stream: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """`m` distinct real tokens per (sequence, head), uniformly; `mask [B, 1, N]`. → indices, valid `[B, H, m]`."""
    b, _, n = mask.shape
    u = selector.uniform((b, heads, n), mask.device, stream)
    return weighted_sample(u, mask.expand(b, heads, n), m)


@dataclass
class UniformConfig:
    """m distinct real tokens drawn uniformly (own seeded generator; a fixed draw at eval)."""

    name: str = "uniform"
    seed: int = follows_run_seed()


class UniformSelector(SeededSelector):
    config = UniformConfig

    token_landmarks = True

    def select(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, m: int) -> Landmarks:
        idx, valid = sample_real_tokens(self, mask, q.shape[1], m)
        return token_landmarks(q, k, idx, valid)

    @classmethod
    def flops(cls, n: int, m: int, d: int, params: Params) -> Flops:
        return Flops(0.0)  # a draw: no arithmetic
