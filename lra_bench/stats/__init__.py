"""Statistics for "does X beat Y?": paired tests, confidence intervals and their wording (modules: see
docs/architecture.md).

Pure numpy/scipy, no torch: `python -m lra_bench.compare` and the leaderboard load it quickly.
"""
