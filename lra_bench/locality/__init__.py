"""The locality study (`python -m lra_bench.locality`): how much of a task `attn=local` reaches over a range of windows
beside full attention and a landmark method at equal budget (Miralles-González et al. 2025, arXiv 2501.14850).
"""
