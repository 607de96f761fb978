"""Tables across runs: every `results.json` below some dirs → leaderboard.md/.csv/plots beside published numbers.

`python -m lra_bench.leaderboard DIR...` (see `build`; the modules: docs/architecture.md). Kept light at import: Hydra
instantiates the sweep callback in every process, so heavy modules load only when used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["build_leaderboard", "log_to_wandb"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from lra_bench.leaderboard import build  # pandas and matplotlib only when asked: see above

        return getattr(build, name)
    raise AttributeError(f"module 'lra_bench.leaderboard' has no attribute {name!r}")
