"""The attentions a leaderboard experiment sweeps (`conf/experiment/leaderboard/*.yaml`): every attention the
registry holds, through the `${leaderboard_attentions:}` resolver.

Why from the registry: a hard-coded list in three YAML files went stale as attentions were added (wildcat and local
each needed three edits, and the published low-rank and kernel baselines — linformer, performer, skyformer — were
never on it, though the published tables report them); now a new attention joins every leaderboard sweep by
existing. `attn=...` on the command line replaces the list (`attn=full,gpa`). Resolved only when Hydra reads the
sweep's parameters (it imports the attentions, hence torch): `--help` and `--cfg job` never resolve it.
"""

from __future__ import annotations

from lra_bench.registry import ATTENTIONS


def leaderboard_attentions() -> str:
    """The swept `attn` values, comma-separated in the registry's (sorted) order: a `hydra.sweeper.params` value."""
    return ",".join(ATTENTIONS.names())
