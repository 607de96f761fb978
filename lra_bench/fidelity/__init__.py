"""Fidelity tables: each protocol read point by point against the reference code its published numbers came from.

One YAML per protocol (`<protocol>.yaml` beside this file) is the single source: every row names a setting, the
reference's value with its place (repository@commit:file:line), the config key that holds ours (when one does), and
a verdict — `same`, or `deviation` with the reason the project keeps it. `python -m lra_bench.fidelity` renders
them into `docs/fidelity.md`; the tests compose every `same` row's config and check our value is the reference's,
and check the page is the rendering of the YAML, so a table cannot claim a match the configs do not hold.
"""

from lra_bench.fidelity.table import PROTOCOLS, Row, load_rows, ours, render

__all__ = ["PROTOCOLS", "Row", "load_rows", "ours", "render"]
