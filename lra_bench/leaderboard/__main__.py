"""`python -m lra_bench.leaderboard DIR... [--out OUTDIR]` (default `outputs/leaderboard/`; see its `build`)."""

import sys

from lra_bench.leaderboard.build import main

sys.exit(main())
