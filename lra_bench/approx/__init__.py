"""Approximation study: `python -m lra_bench.approx` (config `conf/approx.yaml`).

For every selector × m (and every attention at its paper defaults), how close the landmark approximation Â comes to
exact softmax attention A, on synthetic inputs with controlled structure (`synthetic`) and on attention captured
from a trained and a randomly initialised model (`capture`); then computed verdicts on the claims of the four
methods the harness tests (`summary`; the claims are listed in `report.CLAIM_TITLES`).
"""
