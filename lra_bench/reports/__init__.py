"""Report drivers (`results_doc`: docs/results.md; `spt_study`: scratch vs self-pretraining): they only orchestrate
and format the studies' outputs, so they sit above the run stages and the per-study packages.
"""
