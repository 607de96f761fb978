"""`python -m lra_bench.compare A B`: does method A beat method B — per task and on average, with statistics.

A and B are run dirs, sweep dirs, `results.json` files or method selectors (`attn=gpa`,
`attn=nystrom,attn.num_landmarks=32`) over `--in DIR...`. Modules: `sides` (records → one experiment per task and
side; refuses sides that differ in more than the method and seed), `pairing` (pairs runs by seed and test examples
by position, runs `lra_bench.stats`, compares the efficiency measured in the same runs), `report` (the table, the
verdicts, JSON), `cli` (the command line).
"""
