"""Approximation study: `python -m lra_bench.approx` (config `conf/approx.yaml`).

For every selector × m (and every attention at its paper defaults), how close the landmark approximation Â
comes to exact softmax attention A — relative Frobenius error, output residual, the Eckart–Young floor and
the ratio to it, the input's block-coherence — on synthetic inputs with controlled structure
(`lra_bench.approx.synthetic`) and on attention captured from a trained and a randomly initialised model
(`lra_bench.approx.capture`); then computed verdicts on the claims of the four methods the harness tests
(`lra_bench.approx.summary`; the claims and their sources are listed in `lra_bench/approx/report.py`).
Every metric is imported from `lra_bench.diagnostics.metrics`.
"""
