"""Report drivers: commands that run or read finished studies and write a document for people.

`results_doc` renders docs/results.md (`make results`) from the bench, approx, locality, step and spt outputs;
`spt_study` runs scratch vs self-pretraining at equal total steps and renders its section. They sit apart from the
run stages and the per-study packages (`bench`, `approx`, `locality`) because they only orchestrate and format.
"""
