"""What a component costs, in the words every attention and selector uses to describe its own cost.

Each attention declares `flops(n, m, d, params)` and `memory(n, m, d, mode, params)` and each selector
`flops(n, m, d, params)` as classmethods, from its config values `params` (the same keys as its config dataclass,
read through `models.knobs.knobs`, so a knob left out counts at its dataclass default);
the benchmark (`lra_bench.bench`) multiplies by batch × heads and puts the counts beside measured times. Declared
on the class so that a new component carries its cost model with it, and a component without one is caught by the
registry test instead of silently showing no FLOPs.

Convention (the one behind the benchmark's "achieved rate"): matrix products count 2 FLOPs per multiply–add;
elementwise work (exp, softmax, scaling, masking) is not counted, except the few additions that *are* a step's
whole work (segment or cluster means), counted 1 per add. The count is what the algorithm needs, not what a
particular implementation happens to execute (fused kernels that recompute, one-hot matmuls that stand in for a
scatter): the benchmark also records `torch.utils.flop_counter` counts of the real code beside it. Backward of a
differentiable matrix product costs two products, so backward = 2 × the differentiable forward FLOPs; landmark
selection that runs under `no_grad` has no backward. Per (batch · head): n tokens, m landmarks (or features,
projection rows: the rank budget), d head dim.

Memory is an *estimate* in elements (not bytes) of what one call needs beyond its inputs, used only to skip
configurations that would not fit, so it errs high.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Params = Mapping[str, Any]


@dataclass(frozen=True)
class Flops:
    """FLOPs per call: `differentiable` forward work, `selection` (no-grad) forward work, and `backward`
    (default 2 × differentiable; less where a factor is a constant, e.g. Performer's random projection)."""

    differentiable: float
    selection: float = 0.0
    backward: float | None = None

    @property
    def forward(self) -> float:
        return self.differentiable + self.selection

    @property
    def backward_flops(self) -> float:
        return 2.0 * self.differentiable if self.backward is None else self.backward

    @property
    def forward_backward(self) -> float:
        return self.forward + self.backward_flops

    def for_mode(self, mode: str) -> float:
        return self.forward if mode == "forward" else self.forward_backward

    def __add__(self, other: Flops) -> Flops:
        return Flops(
            self.differentiable + other.differentiable,
            self.selection + other.selection,
            self.backward_flops + other.backward_flops,
        )

    def scaled(self, factor: float) -> Flops:
        return Flops(self.differentiable * factor, self.selection * factor, self.backward_flops * factor)


def pinv_flops(m: int, pinv: str, iterations: int) -> float:
    """An m×m core's pseudo-inverse: 4 products per Newton–Schulz step (`pinv: iterative`, `iterations` steps),
    else an SVD, whose ≈ 24 m³ is an order-of-magnitude estimate, not a count."""
    if pinv == "iterative":
        return 8.0 * int(iterations) * m**3
    return 24.0 * m**3


def conv_flops(n: int, d: int, kernel: int) -> float:
    """The depthwise convolution of V along the sequence (`kernel` taps; 0 = none)."""
    return 2.0 * int(kernel or 0) * n * d


def lloyd_flops(n: int, m: int, d: int, iterations: int) -> float:
    """`iterations` Lloyd steps: distances (one matmul) and cluster sums (adds)."""
    return iterations * (2.0 * n * m * d + n * d)


def width_memory(n: int, width: float, d: int, mode: str) -> float:
    """Methods whose big tensors are n × width (landmarks, sketch rows, features): a few of them live at once."""
    return (4.0 if mode == "forward" else 10.0) * n * width + 8.0 * n * d


def fused_memory(n: int, d: int, mode: str) -> float:
    """Fused exact attention (SDPA's flash/memory-efficient kernels): the output and log-sum-exp (+ gradients)."""
    return 8.0 * (2.0 if mode != "forward" else 1.0) * n * d


def quadratic_memory(n: int, mode: str) -> float:
    """Materialised attention: scores and probabilities (+ their gradients)."""
    return (2.0 if mode == "forward" else 4.0) * n * n
