"""GPA's progressive k-means landmarks: a per-layer codebook of query centroids, refreshed every few passes.

What is public about GPA (ICLR 2026 submission 20651, through its reviews only): k-means on the *query*
vectors, m = log₂ n landmarks, 10 Lloyd iterations, landmarks recomputed every 50 passes (an amortisation
parameter L). No code exists. **Our reading** of "recomputed every L passes", implemented here:

* each attention layer owns a codebook of m query centroids per head, `[H, m, D]`, held as buffers (so it
  checkpoints and moves with the model), together with its validity and a pass counter (also buffers);
* in training mode every forward is one pass (a dual-tower model makes two per step; gradient accumulation
  one per micro-batch). On pass 1 and every `refresh_every` passes after it, the codebook is refreshed by
  the shared k-means core (`models/landmarks/kmeans.py`) on the current batch's detached queries, pooled over
  the batch (per head): the first refresh seeds with `init` (k-means++ by default, `restarts` seedings),
  later ones warm-start from the current codebook; Lloyd runs until the assignment stops changing or the
  inertia stalls (`tol`), at most `max_iterations` (default 10, the paper's "10 iterations");
* every sequence — in training and at inference — is assigned to the nearest codebook centroids (one
  N×m distance matmul), and its landmarks are the differentiable query AND key means over those clusters;
  a cluster that gets none of a sequence's real tokens is an invalid landmark for that sequence;
* optionally `local_iterations` per-sequence Lloyd iterations start from the codebook (0 = pure codebook);
* `refresh_every: 1` means plain per-sequence k-means at every call (what "recomputed every pass" means),
  with no codebook at all.

Not implemented: the reviews also name a "local effective-rank threshold τ = 0.05". No public text says what it
thresholds (which singular values, of which matrix, and what the threshold then changes: m, a landmark, a head), so
there is no reading to implement; GPA here is the k-means landmark rule above and nothing else.

Eval mode never changes any state (no counting, no refresh): diagnostics and validation cannot perturb
training. An eval call before the codebook exists falls back to per-sequence k-means (eval-mode draws: fixed,
the training stream untouched). The codebook size is fixed when it is created: `attn=gpa` sizes it at
construction for the configured seq_len (m = log₂ seq_len by default; shorter sequences simply leave some
clusters empty); under another attention it is sized at the first call. Under DDP each rank refreshes from
its own batch and the module's buffer broadcast makes rank 0's codebook everyone's at the next forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from models.cost import Flops, Params, lloyd_flops
from models.knobs import follows_run_seed, knobs
from models.landmarks.base import Landmarks, cluster_means
from models.landmarks.kmeans import (
    KMeansSettings,
    assign,
    cluster_landmarks,
    exact_fp32,
    kmeans_fit,
    kmeans_landmarks,
    kmeans_settings,
    lloyd,
    selector_draw,
)
from models.landmarks.segment_means import segment_assignment
from models.landmarks.uniform import SeededSelector


@dataclass
class GPAConfig:
    """GPA's progressive k-means: a per-layer codebook of query centroids, refreshed every refresh_every passes
    by the same k-means core as `kmeans` (seeded once, then warm-started from the codebook)."""

    name: str = "gpa"
    max_iterations: int = 10  # cap on Lloyd iterations per refresh: the paper's 10 (k-means' own cap is 100)
    tol: float = KMeansSettings.tol  # converged when the inertia falls by less than tol (relative) in one step
    restarts: int = KMeansSettings.restarts  # seedings of the first codebook; the lowest inertia is kept
    refresh_every: int = 50  # training passes between codebook refreshes; 1 = plain per-sequence k-means
    init: str = KMeansSettings.init  # first codebook: kmeans++ | segment_means | random
    empty: str = KMeansSettings.empty  # empty clusters at refresh: farthest | keep
    local_iterations: int = 0  # per-sequence Lloyd iterations started from the codebook
    seed: int = follows_run_seed()


class ProgressiveKMeansSelector(SeededSelector):
    config = GPAConfig
    codebook: torch.Tensor
    codebook_valid: torch.Tensor
    passes: torch.Tensor
    refreshes: torch.Tensor

    randomized = False

    def configure(self, cfg: GPAConfig) -> None:
        super().configure(cfg)
        self.settings = kmeans_settings(cfg)
        if int(cfg.refresh_every) < 1:
            raise ValueError(f"selector.refresh_every={cfg.refresh_every}: must be >= 1 (1 = per-sequence k-means)")
        self.refresh_every, self.local_iterations = int(cfg.refresh_every), int(cfg.local_iterations)
        self.last_iterations = 0  # Lloyd iterations of the last refresh (or per-sequence fit)
        self.register_buffer("codebook", torch.zeros(0))
        self.register_buffer("codebook_valid", torch.zeros(0, dtype=torch.bool))
        self.register_buffer("passes", torch.zeros((), dtype=torch.long))
        self.register_buffer("refreshes", torch.zeros((), dtype=torch.long))
        self._passes = self._refreshes = 0  # host-side mirrors of the buffers (no device sync per call)

    # -- codebook state --------------------------------------------------------------------------------
    @property
    def progressive(self) -> bool:
        return self.refresh_every > 1

    @property
    def codebook_size(self) -> int | None:
        """Number of centroids once the codebook exists (or is bound), else None."""
        return int(self.codebook.shape[1]) if self.codebook.dim() == 3 else None

    def bind(self, num_heads: int, head_dim: int, m: int) -> None:
        """Allocate the codebook `[num_heads, m, head_dim]` up front (so state_dict shapes are fixed)."""
        if self.progressive:
            dev = self.codebook.device
            self.codebook = torch.zeros(num_heads, m, head_dim, device=dev)
            self.codebook_valid = torch.zeros(num_heads, m, dtype=torch.bool, device=dev)

    @property
    def initialized(self) -> bool:
        return self.codebook.dim() == 3 and self._refreshes > 0

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        for name in ("codebook", "codebook_valid"):  # a lazily sized codebook takes the checkpoint's shape
            saved = state_dict.get(prefix + name)
            if saved is not None and saved.shape != getattr(self, name).shape:
                setattr(self, name, torch.zeros_like(saved, device=getattr(self, name).device))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._passes, self._refreshes = int(self.passes), int(self.refreshes)

    @torch.no_grad()
    def refresh(self, q: torch.Tensor, mask: torch.Tensor, m: int) -> None:
        """k-means on the batch's queries pooled per head: seeded the first time, then warm-started from the
        codebook (the same core as the `kmeans` selector)."""
        b, h, n, d = q.shape
        with exact_fp32(q.device):
            x = q.detach().float().transpose(0, 1).reshape(1, h, b * n, d)
            pooled = mask.reshape(1, 1, b * n)
            start = None
            if self.initialized and self.codebook.shape[:1] == (h,):
                start = (self.codebook.float().unsqueeze(0), self.codebook_valid.unsqueeze(0))
            elif self.settings.init == "segment_means":  # position-segment means of each sequence, pooled
                seg = segment_assignment(mask, m).expand(b, h, n).transpose(0, 1).reshape(1, h, b * n)
                means, counts = cluster_means(x, seg, pooled, m)
                start = (means, counts > 0)
            fit = kmeans_fit(x, pooled, m, self.settings, selector_draw(self, q.device), start=start)
        self.last_iterations = fit.iterations
        c, c_valid = fit.centroids, fit.valid
        if self.codebook.shape != c.shape[1:]:
            self.codebook = torch.zeros(c.shape[1:], device=q.device, dtype=self.codebook.dtype)
            self.codebook_valid = torch.zeros(c.shape[1:3], device=q.device, dtype=torch.bool)
        self.codebook.copy_(c[0])
        self.codebook_valid.copy_(c_valid[0])
        self.refreshes += 1
        self._refreshes += 1

    # -- selection -------------------------------------------------------------------------------------
    def count_pass(self) -> None:
        self.passes += 1
        self._passes += 1

    def select(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, m: int) -> Landmarks:
        draw = selector_draw(self, q.device)
        if not self.progressive:
            if self.training:
                self.count_pass()
            lm, fit = kmeans_landmarks(q, k, mask, m, self.settings, draw)
            self.last_iterations = fit.iterations
            return lm
        size = self.codebook_size or m
        if self.training:
            self.count_pass()
            if not self.initialized or (self._passes - 1) % self.refresh_every == 0:
                self.refresh(q, mask, size)
        elif not self.initialized:  # eval before any training pass: per-sequence k-means, no state change
            return kmeans_landmarks(q, k, mask, size, self.settings, draw)[0]
        with exact_fp32(q.device):
            x = q.detach().float()
            c, c_valid = self.codebook.float().unsqueeze(0), self.codebook_valid.unsqueeze(0)
            if self.local_iterations:
                c, c_valid = c.expand(q.shape[0], -1, -1, -1), c_valid.expand(q.shape[0], -1, -1)
                fit = lloyd(x, mask, c, c_valid, self.local_iterations, self.settings.tol, self.settings.empty)
                c, c_valid = fit.centroids, fit.valid
            assignment, _ = assign(x, c, c_valid, distances=False)
        return cluster_landmarks(q, k, mask, assignment, size)

    @classmethod
    def flops(cls, n: int, m: int, d: int, params: Params) -> Flops:
        # steady state: assign every token to the codebook (one matmul) + q and k means; the refresh (Lloyd on the
        # pooled batch, warm-started from the codebook, at its iteration cap: an upper bound) runs once every
        # `refresh_every` passes and is counted amortised (the first refresh's seeding once, not counted)
        cfg = knobs(GPAConfig, params)
        every = max(1, int(cfg.refresh_every))
        its = int(cfg.max_iterations)
        local = int(cfg.local_iterations)
        steady = 2.0 * n * m * d + 2.0 * n * d
        return Flops(0.0, steady + lloyd_flops(n, m, d, its) / every + lloyd_flops(n, m, d, local))
