"""Hydra sweep machinery: what runs around a multirun rather than inside one run.

`tuning` holds the `tuned` resolver and the callback that ends an `hparams_search` (fair tuning). The callback
that builds the leaderboard at the end of a multirun lives with the leaderboard (`lra_bench.leaderboard`).
"""
