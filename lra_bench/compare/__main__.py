"""`python -m lra_bench.compare A B` (see `lra_bench.compare.cli`)."""

import sys

from lra_bench.compare.cli import main

sys.exit(main())
