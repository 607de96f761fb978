"""`python -m lra_bench.leaderboard DIR... [--out OUTDIR]` (see `lra_bench.leaderboard.build`)."""

import sys

from lra_bench.leaderboard.build import main

sys.exit(main())
