"""`python -m lra_bench.compare A B`: does method A beat method B — per task and on average, with statistics.

A and B are run dirs, sweep dirs, `results.json` files or method selectors (`attn=gpa`,
`attn=nystrom,attn.num_landmarks=32`) over `--in DIR...`. Modules: see docs/architecture.md.
"""
