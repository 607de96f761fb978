"""The faithful training step against the machine's limit: `python -m lra_bench.bench.step task=listops attn=nystrom`.

The attention sweep (`python -m lra_bench.bench`) times one operator; what a reproduction waits for is the whole
protocol: the run's own network (built from the composed config, as `run.py` builds it), its loss, backward and
AdamW step with the protocol's schedule, plus the evaluation passes the schedule interleaves. Per attention this
reports

* `step_s`: the median wall time of one training step (forward, loss, backward, optimizer), after warm-up steps;
* `eval_batch_s`: one evaluation batch (`eval()`, no grad) at the protocol's evaluation batch size;
* `flops_step`: the step's FLOPs counted by `torch.utils.flop_counter.FlopCounterMode` (matmuls, convolutions,
  SDPA: the work a limit can be computed for), and `limit_s`: those FLOPs at the machine's fp32 matmul rate,
  measured in the same process (`lra_bench.bench.machine.matmul_rate`) — `step_s / limit_s` is how far the step is
  from that limit (1.0: every FLOP at the best matmul rate);
* `protocol_h`: the projected wall time of the whole schedule — `max_steps` steps plus
  `max_steps / val_check_interval` evaluations of `limit_val_batches` batches (the test pass is left out: one pass).

Inputs are random tokens with each example's length drawn uniformly from the task's generated range (ListOps:
500–2000 of 2048), so the padding mask is what the real data gives. Load matters on a shared machine: the report
states the 1-minute load average before and after; compare runs only side by side in one invocation.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass
class StepTiming:
    attn: str
    task: str
    protocol: str
    precision: str
    batch_size: int
    seq_len: int
    step_s: float
    step_spread_s: float  # interquartile range of the timed steps
    steps_timed: int
    eval_batch_s: float
    flops_step: float
    matmul_flops_per_s: float
    limit_s: float
    ratio: float
    protocol_h: float
    threads: int


def protocol_config(task: str, attn: str, protocol: str, extra: list[str]) -> Any:
    """The run's config, settled as a run settles it (typed component values, derived stage keys)."""
    from lra_bench.config.compose import compose_config
    from lra_bench.record.conformance import derive_run_keys

    cfg = compose_config([f"task={task}", f"attn={attn}", f"protocol={protocol}", *extra])
    derive_run_keys(cfg)
    return cfg


def faithful_network(cfg: Any) -> torch.nn.Module:
    from omegaconf import OmegaConf

    from lra_bench.run.build import build_network, selector_node

    return build_network(
        vocab_size=int(cfg.task.vocab_size),
        seq_len=int(cfg.task.seq_len),
        num_classes=int(cfg.task.num_classes),
        dual=bool(cfg.task.dual),
        model=OmegaConf.to_container(cfg.model, resolve=True),
        attn=OmegaConf.to_container(cfg.attn, resolve=True),
        selector=selector_node(cfg),
    )


def random_batch(cfg: Any, batch_size: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Random tokens, each example padded after a length drawn from the task's range (whole length if none)."""
    n = int(cfg.task.seq_len)
    low = int(cfg.task.get("gen_min_length", n) or n)
    high = min(int(cfg.task.get("max_length", n) or n), n)
    lengths = torch.randint(min(low, high), high + 1, (batch_size,), generator=gen)
    mask = torch.arange(n)[None, :] < lengths[:, None]
    ids = torch.randint(1, int(cfg.task.vocab_size), (batch_size, n), generator=gen) * mask
    batch = {"input_ids": ids, "mask": mask, "label": torch.randint(0, int(cfg.task.num_classes), (batch_size,))}
    if bool(cfg.task.dual):
        batch.update(input_ids_2=ids.clone(), mask_2=mask.clone())
    return batch


def autocast(precision: str) -> Any:
    if precision.startswith("bf16"):
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def time_protocol(
    task: str,
    attn: str,
    protocol: str = "nystromformer",
    extra: list[str] | None = None,
    steps: int = 6,
    warmup: int = 2,
    eval_batches: int = 3,
    rate: float | None = None,
) -> StepTiming:
    from torch.utils.flop_counter import FlopCounterMode

    from lra_bench.bench.machine import matmul_rate
    from lra_bench.run.module import adamw_with_schedule

    cfg = protocol_config(task, attn, protocol, list(extra or []))
    torch.manual_seed(int(cfg.seed))
    model = faithful_network(cfg)
    optim = adamw_with_schedule(model.parameters(), dict(cfg.optim), int(cfg.trainer.max_steps))
    optimizer, scheduler = optim["optimizer"], optim["lr_scheduler"]["scheduler"]
    precision = str(cfg.trainer.get("precision", "32-true"))
    batch_size = int(cfg.data.batch_size)
    gen = torch.Generator().manual_seed(0)
    batches = [random_batch(cfg, batch_size, gen) for _ in range(2)]

    def step(batch: dict[str, torch.Tensor]) -> None:
        with autocast(precision):
            logits = model(batch)
        loss = F.cross_entropy(logits.float(), batch["label"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()

    model.train()
    with FlopCounterMode(display=False) as counter:
        step(batches[0])
    flops = float(counter.get_total_flops())
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        step(batches[i % 2])
        if i >= warmup:
            times.append(time.perf_counter() - start)
    model.eval()
    eval_size = int(cfg.data.get("eval_batch_size") or batch_size)
    eval_batch = random_batch(cfg, eval_size, gen)
    eval_times = []
    with torch.no_grad():
        for i in range(1 + eval_batches):
            start = time.perf_counter()
            with autocast(precision):
                model(eval_batch)
            if i:
                eval_times.append(time.perf_counter() - start)
    rate = rate or matmul_rate(torch.device("cpu"))["flops_per_s"]
    step_s, eval_s = statistics.median(times), statistics.median(eval_times)
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [step_s, step_s, step_s]
    max_steps = int(cfg.trainer.max_steps)
    evaluations = max_steps // int(cfg.trainer.val_check_interval)
    val_batches = int(cfg.trainer.limit_val_batches)
    return StepTiming(
        attn=attn,
        task=task,
        protocol=protocol,
        precision=precision,
        batch_size=batch_size,
        seq_len=int(cfg.task.seq_len),
        step_s=step_s,
        step_spread_s=q[2] - q[0],
        steps_timed=len(times),
        eval_batch_s=eval_s,
        flops_step=flops,
        matmul_flops_per_s=rate,
        limit_s=flops / rate,
        ratio=step_s / (flops / rate),
        protocol_h=(max_steps * step_s + evaluations * val_batches * eval_s) / 3600,
        threads=torch.get_num_threads(),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="listops")
    parser.add_argument("--attn", nargs="+", default=["nystrom", "gpa", "full"])
    parser.add_argument("--protocol", default="nystromformer")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. trainer.precision=bf16-mixed")
    args = parser.parse_args(argv)
    from lra_bench.bench.machine import matmul_rate

    load_before = os.getloadavg()[0]
    rate = matmul_rate(torch.device("cpu"))["flops_per_s"]
    rows = [
        time_protocol(args.task, a, args.protocol, args.overrides, args.steps, args.warmup, rate=rate)
        for a in args.attn
    ]
    print(
        f"fp32 matmul rate {rate / 1e9:.1f} GFLOP/s, {torch.get_num_threads()} thread(s), "
        f"load {load_before:.2f} → {os.getloadavg()[0]:.2f}"
    )
    for r in rows:
        print(asdict(r))


if __name__ == "__main__":
    main()
