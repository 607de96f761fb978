"""The attention interface every variant implements.

`forward(q, k, v, mask) -> out` with `q, k, v: [B, H, N, D]` and `mask: [B, N]` bool (True = real token,
None = no padding). Variants know nothing of tasks or training. `implied_matrix(q, k, mask)` returns the
N×N row-operator the method applies to V (exact softmax for `full`); it exists for diagnostics on short
probe sequences only — no training path may call it.

Causal attention (token i attends to keys j <= i, for next-token self-pretraining) is a property a variant
declares with `supports_causal`; `set_causal(True)` switches an instance into that mode and refuses on a variant
that has no causal form (most approximations mix every key into a shared summary, so position i would see the
future). A mode on the instance, not a `forward` argument: the nine variants and the projection wrapper keep one
signature, and only the language-model stage ever switches it on.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from models.cost import Flops, Params, width_memory
from models.knobs import NamedByConfig, knobs

#: `Attention.approximates` of every variant that computes or estimates softmax attention
SOFTMAX = "softmax attention"


class Attention(NamedByConfig, nn.Module):
    """Base class. A variant describes itself: its `name` and `config`, whether it takes a landmark selector
    (`takes_selector`, and `needs_token_landmarks` when its landmarks must be tokens), which config knob holds its
    rank budget (`rank_knob`), its cost model (`flops`, `memory`) and, per instance, the rank it spends
    (`rank_budget`). The harness asks these hooks instead of keeping tables of names."""

    #: whether a `selector` is part of this attention's configuration
    takes_selector: ClassVar[bool] = False
    #: the selector its option brings (its paper's choice: the defaults list of `conf/attn/<name>.yaml`)
    default_selector: ClassVar[str | None] = None
    #: whether its landmarks must be tokens of the sequence (exact columns of A): cluster-mean selectors refused
    needs_token_landmarks: ClassVar[bool] = False
    #: the config field that holds the rank budget (landmarks, projection rows, features); None = no budget
    rank_knob: ClassVar[str | None] = None
    #: how many n × m tensors a call keeps alive, in units of the rank budget m (the default memory estimate)
    memory_width: ClassVar[float] = 1.0
    #: the `attn=` option name, `config.name` (`NamedByConfig`); a class with its own `name` is registered
    name: ClassVar[str] = ""
    #: the config dataclass (`models.knobs`): `name` plus one field per knob, each default written there only; the
    #: constructor takes an instance of it (`cfg`), `flops`/`memory` read it, `conf/attn/<name>.yaml` is generated
    config: ClassVar[type | None] = None
    #: whether the variant has an exact causal form (`set_causal(True)`), used by causal self-pretraining
    supports_causal: ClassVar[bool] = False
    #: the operator the variant computes or estimates: `SOFTMAX` (softmax attention, exactly or approximately), or
    #: what it stands for instead. Its error against softmax attention is an approximation error only for
    #: `SOFTMAX`; for any other it is the distance between two operators (the reproductions page says which)
    approximates: ClassVar[str] = SOFTMAX
    #: whether the encoder around this instance runs its chain compiled (`model.kernels` auto | fused; the encoder
    #: sets it): a variant then runs its own memory-bound passes through compiled kernels where they apply (Nyström's
    #: convolution skip), so one setting says how a whole network computes. False for an attention called on its own
    #: (the attention benchmark, the approximation study, tests): the eager form
    compiled: bool = False

    def __init__(
        self, head_dim: int, num_heads: int, seq_len: int, cfg: Any = None, selector: nn.Module | None = None
    ) -> None:
        """The one constructor of every attention: the shared geometry, then `cfg` (the variant's `config`
        instance, its defaults when None) handed to `configure`, where the variant reads its own knobs. `selector`:
        the landmark selector of a variant that takes one (`takes_selector`), set before `configure` runs."""
        super().__init__()
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.seq_len = seq_len
        self.causal = False
        if selector is not None:
            self.selector = selector
        if cfg is None and self.config is not None:
            cfg = self.config()
        self.configure(cfg)

    def configure(self, cfg: Any) -> None:
        """Read the variant's knobs from `cfg`, its config dataclass (nothing to read by default)."""

    def share_with(self, first: Attention) -> None:
        """Tie what this instance shares across layers to `first`, the attention of the encoder's first block: the
        encoder calls it on every later block's attention once all are built. A variant whose config shares a
        parameter across layers makes its own attribute the same `nn.Parameter` object as `first`'s (so it is one
        tensor in `parameters()`, and a state dict loads into both); by default nothing is shared."""

    def set_causal(self, causal: bool) -> None:
        """Attend to keys j <= i only (True) or to every key (False); ValueError on a variant without a causal form."""
        if causal and not self.supports_causal:
            raise ValueError(f"attn={self.name or type(self).__name__} has no causal form (supports_causal=False)")
        self.causal = bool(causal)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def implied_matrix(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The `[B, H, N, N]` matrix Â with `forward(q, k, v) ≈ Â v` (padded rows/cols zero)."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its implied matrix")

    def rank_budget(self, seq_len: int) -> int | None:
        """The nominal rank this instance spends on a sequence of `seq_len` tokens (its landmarks, features or
        projection rows; the diagnostics' Eckart–Young budget); None = no low-rank budget (exact attention)."""
        return None

    def extra_diagnostics(self) -> dict[str, float]:
        """Scalars a variant reports about its last forward (e.g. the rank kept); empty by default."""
        return {}

    @classmethod
    def flops(cls, n: int, m: int | None, d: int, params: Params) -> Flops:
        """FLOPs of one call per (batch · head) at n tokens, rank budget m, head dim d, with the config values
        `params` (see `models.cost` for the convention). Every attention declares it."""
        raise NotImplementedError(f"attn={cls.name or cls.__name__} declares no FLOP count (`flops`)")

    @classmethod
    def memory(cls, n: int, m: int | None, d: int, mode: str, params: Params) -> float:
        """Elements one call needs beyond its inputs per (batch · head), `mode` forward | forward_backward: an
        estimate that errs high (the benchmark skips what would not fit). By default, for an attention with a rank
        knob, a few n × (`memory_width` · m) tensors (`models.cost.width_memory`); others declare their own."""
        if cls.rank_knob is None:
            raise NotImplementedError(f"attn={cls.name or cls.__name__} declares no memory estimate (`memory`)")
        width = m
        if width is None and cls.config is not None:  # the budget the knob sets (at its default when left out)
            width = getattr(knobs(cls.config, params), cls.rank_knob)
        return width_memory(n, cls.memory_width * float(width or 0), d, mode)
