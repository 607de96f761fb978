"""Attention speed and memory against sequence length: `python -m lra_bench.bench` (config `conf/bench.yaml`).

The sweep is attn × selector × n × m over whatever `models.attention` and `models.landmarks` register, timed
in two modes: `forward` (inference: `eval()` under `no_grad`) and `forward_backward` (training: `train()`,
forward then backward of a fixed random upstream gradient into q, k, v and the module's parameters).

Per configuration and mode we report the median and interquartile range of the wall-clock times of
`repeats` timed calls after `warmup` untimed ones (CUDA synchronised before and after each call), the peak
memory the calls needed (see `lra_bench.memory` for exactly what is measured), the FLOPs the method
needs (`lra_bench.bench.costs`) and the achieved rate as a fraction of this machine's fp32 matmul rate,
measured in the same run. Each configuration runs in its own process (a fork of a pre-imported server) so its
memory is its own; a configuration whose estimated memory exceeds the budget is skipped with a note, and one
that raises is recorded as an error — neither stops the sweep.
"""
