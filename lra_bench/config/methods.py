"""The attentions a leaderboard experiment sweeps (`conf/experiment/leaderboard/*.yaml`): every attention the
registry holds but `NOT_ON_LEADERBOARD`, through the `${leaderboard_attentions:}` resolver.

Why from the registry: a hard-coded list in three YAML files went stale as attentions were added (wildcat and local
each needed three edits); now a new attention joins every leaderboard sweep by existing. The three left out are the
ones those lists never held — linformer, performer and skyformer, the published low-rank and kernel baselines
— so the sweeps run what they ran before; `attn=...` on the command line replaces the list (`attn=full,linformer`).
Resolved only when Hydra reads the sweep's parameters (it imports the attentions, hence torch): `--help` and
`--cfg job` never resolve it.
"""

from __future__ import annotations

#: registered attentions the leaderboard experiments leave out (see the module docstring)
NOT_ON_LEADERBOARD: tuple[str, ...] = ("linformer", "performer", "skyformer")


def leaderboard_attentions() -> str:
    """The swept `attn` values, comma-separated in the registry's (sorted) order: a `hydra.sweeper.params` value."""
    from lra_bench.registry import ATTENTIONS

    return ",".join(name for name in ATTENTIONS.names() if name not in NOT_ON_LEADERBOARD)
