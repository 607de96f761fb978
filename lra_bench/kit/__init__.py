"""The bottom layer: small helpers every other part shares, importing nothing of `lra_bench`.

`numbers` (the one rule for a printed ratio), `markdown` (the one pipe table), `terminal` (the rich Console of
printed tables), `figures` (a matplotlib figure saved the one way), `plain` (a mapping config node as a typed dict),
`say` (a line of its own under a live progress bar). They sit below the run, the studies and the reports alike, so
none of those has to import another for a table, a number, a figure or a printed line.
"""
