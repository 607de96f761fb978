"""The pre-flight, above the run: what `run.py`, `python -m lra_bench.bench` and the checked sweeper do before Hydra
writes anything.

`command_line` composes the command line's overrides as `@hydra.main` will and checks them (bad input: one line,
exit 2); `digest` keeps the checked config's digest, and the job's first step compares the config Hydra composed for
it with that one. Light at import (no torch, no Lightning): `run.py --help` and `--cfg job` load it.
"""
