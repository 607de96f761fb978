"""Networks: the encoder, its heads, attention operators and landmark selectors.

`models` depends only on torch (and the standard library); it knows nothing of tasks, Hydra or training.
"""
