"""The locality study (`python -m lra_bench.locality`): `attn=local` over a range of windows beside full attention and
a landmark method at equal budget — how much of a task a model that sees only w tokens on each side already reaches
(Miralles-González et al. 2025, arXiv 2501.14850). `settings` (the command line), `runs` (one `run.py` per arm, read
from its record), `report` (summary, markdown, plot); `python -m lra_bench.reports.results_doc --locality DIR` puts
the page into docs/results.md."""
