"""Statistics for "does X beat Y?": paired tests, confidence intervals and their wording.

Modules: `paired` (per-task paired comparison: exact McNemar and a bootstrap over test examples for one seed, a
paired t-test over seeds, the hierarchical bootstrap over seeds and examples), `summary` (intervals computed from
per-group summaries — mean, sd, n — as the leaderboard has them: the t-interval of a mean, the interval of an
average of task means, Holm's correction, tie-aware ranks), `verdict` (one plain sentence per result), `speed`
(a step-time ratio with its interval, or "too few timed steps to tell"), `power` (how many seeds a difference
needs, from the seed spread).

Pure numpy/scipy, no torch: `python -m lra_bench.compare` and the leaderboard load it quickly.
"""
