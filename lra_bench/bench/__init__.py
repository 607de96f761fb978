"""Attention speed and memory against sequence length: `python -m lra_bench.bench` (config `conf/bench.yaml`).

The sweep is attn × selector × n × m over whatever `models.attention` and `models.landmarks` register, timed in two
modes: `forward` (inference: `eval()` under `no_grad`) and `forward_backward` (training: `train()`, forward then
backward of a fixed random upstream gradient into q, k, v and the module's parameters). Per configuration and mode:
median and IQR of `repeats` timed calls after `warmup` (`worker`), the peak memory (`lra_bench.memory`), the FLOPs
(`costs`) and the achieved rate as a fraction of this machine's fp32 matmul rate measured in the same run
(`machine`). Each configuration runs in a process of its own, so its memory is its own; one over the memory budget is
skipped with a note, one that raises is recorded as an error — neither stops the sweep (`sweep`).
"""
