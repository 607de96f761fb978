"""`python -m lra_bench.evaluate CHECKPOINT [--out DIR] [--retest] [KEY=VALUE ...]`: the public command name of
`lra_bench.run.eval_cli` (test exactly one checkpoint); the stage itself lives in the run package."""

from __future__ import annotations

import sys

from lra_bench.run.eval_cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
