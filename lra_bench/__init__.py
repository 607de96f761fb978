"""The harness: training glue, callbacks, diagnostics, result records, leaderboard, benchmark and approximation
studies. Depends on `models` and `tasks`; they never import it."""
