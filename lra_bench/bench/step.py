"""The faithful training step against the machine's limit: `python -m lra_bench.bench.step task=listops attn=nystrom`.

The attention sweep (`python -m lra_bench.bench`) times one operator; what a reproduction waits for is the whole
protocol: the run's own network, loss, backward and AdamW step, plus the evaluation passes the schedule interleaves.
Per attention: the median step, one evaluation batch, the step's FLOPs and `limit_s`, those FLOPs at the fp32 matmul
rate measured between the steps (`step_s / limit_s` = 1.0: every FLOP at the best matmul rate), and the whole
protocol projected from them (the test pass left out).

Inputs are random tokens with lengths drawn from the task's generated range, so the padding mask is what the real
data gives. Load matters on a shared machine: each row states the 1-minute load average; compare variants only side
by side in one invocation (`--kernels fused eager`, `--dropout packed native`: timed round-robin).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from lra_bench.kit.markdown import table
from lra_bench.runtime import prepare_process

if __name__ == "__main__":  # as a run does, before torch loads libgomp: idle threads sleep, freed memory stays
    prepare_process()

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode, register_flop_formula, sdpa_backward_flop_count, sdpa_flop_count

from lra_bench import runtime
from lra_bench.bench.machine import matmul_yardstick, resolve_device
from lra_bench.bench.worker import timed
from lra_bench.config.compose import compose_config
from lra_bench.config.conformance import derive_run_keys
from lra_bench.record.provenance import cpu_fields, cpu_identity, cpu_name
from lra_bench.registry import ATTENTIONS, SELECTORS
from models.dropout import Dropout


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
    device: str
    load_1m: float  # the machine's 1-minute load average when this row was timed


def protocol_config(task: str, attn: str, protocol: str, extra: list[str]) -> Any:
    """The run's config, settled as a run settles it (typed component values, derived stage keys)."""
    cfg = compose_config([f"task={task}", f"attn={attn}", f"protocol={protocol}", *extra])
    derive_run_keys(cfg)
    return cfg


def faithful_network(cfg: Any) -> torch.nn.Module:
    """The network `run.py` builds from `cfg`; no data is read: the task node holds the shape a data module gives."""
    # the run's code (Lightning) only when a network is built: `--help` and a bad argument stay at torch
    from lra_bench.run.build import build_model

    return build_model(cfg, cfg.task)


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


def autocast(precision: str, device: torch.device) -> Any:
    """Lightning's `bf16-mixed` / `16-mixed` as the trainer applies them (the attention cores stay fp32 inside)."""
    dtype = {"bf16": torch.bfloat16, "16": torch.float16}.get(precision.split("-")[0])
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


@functools.cache  # registered once per process
def count_cpu_sdpa() -> None:
    """Teach `FlopCounterMode` the CPU flash-attention kernels SDPA dispatches to (torch counts only the CUDA
    ones, so exact attention's n² products went uncounted on a CPU), with torch's own SDPA formulas."""
    aten = torch.ops.aten

    @register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu, get_raw=True)
    def _forward(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> int:
        return sdpa_flop_count(query.shape, key.shape, value.shape)

    @register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward, get_raw=True)
    def _backward(grad_out: Any, query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> int:
        return sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)


def counted_flops(counts: dict[Any, int]) -> float:
    """FLOPs of one step (matmuls, convolutions, SDPA: the work a limit can be computed for), a grouped convolution's
    backward counted as twice its forward (input and weight gradients): torch's formula counts it as a dense one, 38
    GFLOPs instead of 1.2 for the kernel-35 depthwise skip on V."""
    by_name = {str(op).split(".")[-1]: float(n) for op, n in counts.items()}
    if "convolution_backward" in by_name:
        by_name["convolution_backward"] = 2.0 * by_name.get("convolution", 0.0)
    return sum(by_name.values())


def _network(cfg: Any, device: torch.device, dropout: str) -> torch.nn.Module:
    """The protocol's network on `device`; `dropout="native"` swaps its dropouts for torch's `nn.Dropout` (to
    measure what `models.dropout` changed)."""
    model = faithful_network(cfg).to(device)
    if dropout == "native":
        for module in model.modules():
            if isinstance(module, Dropout):
                module.forward = torch.nn.Dropout.forward.__get__(module)  # type: ignore[method-assign]
    return model


def _optimizer(model: torch.nn.Module, cfg: Any) -> tuple[Any, Any]:
    """The protocol's AdamW and its learning-rate scheduler, as training builds them."""
    from lra_bench.run.module import adamw_with_schedule  # (Lightning: see `faithful_network`)

    optim = adamw_with_schedule(model.parameters(), dict(cfg.optim), int(cfg.trainer.max_steps))
    optimizer, schedule = optim["optimizer"], optim["lr_scheduler"]
    return optimizer, schedule["scheduler"] if isinstance(schedule, dict) else schedule


def _protocol_hours(cfg: Any, step_s: float, eval_s: float) -> float:
    """The whole protocol projected from one step and one evaluation batch: max_steps steps plus every
    evaluation's limit_val_batches batches."""
    max_steps = int(cfg.trainer.max_steps)
    evaluations = max_steps // int(cfg.trainer.val_check_interval)
    val_batches = int(cfg.trainer.limit_val_batches)
    return (max_steps * step_s + evaluations * val_batches * eval_s) / 3600


@dataclass
class Setup:
    """One row's network, optimizer and inputs, ready to step: what the timing loop calls."""

    label: str
    task: str
    protocol: str
    cfg: Any
    device: torch.device
    precision: str
    batch_size: int
    flops: float  # one step's, counted on an untimed first step of the eager form (the work, whatever path runs it)
    step: Callable[[int], None]  # the i-th training step (the two random batches alternate)
    evaluate: Callable[[int], None]  # one evaluation batch (no grad)


def prepare(
    task: str,
    attn: str,
    protocol: str = "nystromformer",
    extra: list[str] | None = None,
    device: torch.device | None = None,
    dropout: str = "packed",
    kernel: str | None = None,
) -> Setup:
    """The faithful training step of `attn` on `task` under `protocol`, built and stepped once (its FLOPs counted);
    `extra`: config overrides; `dropout="native"`: torch's `nn.Dropout` (to measure what `models.dropout` changed);
    `kernel`: the path of `kernel_overrides`, named in the row."""
    cfg = protocol_config(task, attn, protocol, list(extra or []))
    if kernel is not None:  # the overrides depend on the selector the protocol gives the attention
        selector = str(cfg.selector.name) if ATTENTIONS.get(attn).takes_selector else None
        cfg = protocol_config(task, attn, protocol, [*kernel_overrides(attn, kernel, selector), *(extra or [])])
    device = device or torch.device("cpu")
    torch.manual_seed(int(cfg.seed))
    model = _network(cfg, device, dropout)
    optimizer, scheduler = _optimizer(model, cfg)
    precision = str(cfg.trainer.get("precision", "32-true"))
    batch_size = int(cfg.data.batch_size)
    gen = torch.Generator().manual_seed(0)
    batches = [{k: v.to(device) for k, v in random_batch(cfg, batch_size, gen).items()} for _ in range(2)]
    eval_size = int(cfg.data.get("eval_batch_size") or batch_size)
    eval_batch = {k: v.to(device) for k, v in random_batch(cfg, eval_size, gen).items()}

    def step(i: int) -> None:
        model.train()
        batch = batches[i % 2]
        with autocast(precision, device):
            logits = model(batch)
        loss = F.cross_entropy(logits.float(), batch["label"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()

    def evaluate(_: int) -> None:
        model.eval()
        with torch.no_grad(), autocast(precision, device):
            model(eval_batch)

    count_cpu_sdpa()
    with FlopCounterMode(display=False) as counter:
        step(0)
    label = attn + (f" ({dropout} dropout)" if dropout != "packed" else "") + (f" ({kernel} kernels)" * bool(kernel))
    flops = counted_flops(counter.get_flop_counts()["Global"])
    if kernel != "eager":  # a compiled core's products are hidden from the counter: every path's work is the eager's
        flops = prepare(task, attn, protocol, extra, device, dropout, "eager").flops
    return Setup(label, task, protocol, cfg, device, precision, batch_size, flops, step, evaluate)


def time_side_by_side(
    setups: list[Setup], steps: int = 6, warmup: int = 2, eval_batches: int = 3, rate: float | None = None
) -> list[StepTiming]:
    """Time each setup's training step and evaluation batch round-robin — step i of every setup before step i + 1
    of any — so that a change in the machine's load while they run falls on every row alike (the way to compare two
    paths of one network on a shared machine). Without a given `rate`, the yardstick matmul takes its turn in every
    round too, and the rows' limit is its median rate under the same load. It runs twice a turn and the second call
    is the one timed: the first after a step that materialised gigabytes (full attention's eager form) ran at a third
    of the rate of the calls after it (31–50 against 130–155 GFLOP/s, Intel Ice Lake, one thread), and made the full
    rows' limit ~2.7× too long. Each row's load is the mean 1-minute load average over the whole timing."""
    device = setups[0].device
    yardstick = None if rate is not None else matmul_yardstick(device)
    load = os.getloadavg()[0]
    settle_and_time = [yardstick.call, yardstick.call] if yardstick else []
    times = _round_robin([s.step for s in setups] + settle_and_time, warmup, steps, device)
    if yardstick is not None:
        rate = yardstick.flops / statistics.median(times.pop())
        times.pop()  # the settling call's
    eval_times = _round_robin([s.evaluate for s in setups], 1, eval_batches, device)
    load = (load + os.getloadavg()[0]) / 2
    assert rate is not None
    return [_row(s, t, e, rate, load) for s, t, e in zip(setups, times, eval_times)]


def _round_robin(
    calls: list[Callable[[int], None]], warmup: int, count: int, device: torch.device
) -> list[list[float]]:
    """Wall-clock seconds (`timed`) of `calls[k](i)` for i = warmup … warmup + count − 1, after `warmup` untimed
    rounds, the calls interleaved (round i calls each of them once)."""
    times: list[list[float]] = [[] for _ in calls]
    for i in range(warmup + count):
        for k, call in enumerate(calls):
            elapsed = timed(device, call, i)
            if i >= warmup:
                times[k].append(elapsed)
    return times


def _row(setup: Setup, times: list[float], eval_times: list[float], rate: float, load: float) -> StepTiming:
    """One setup's timings as a table row (medians, the steps' interquartile range, the projection)."""
    cfg = setup.cfg
    step_s, eval_s = statistics.median(times), statistics.median(eval_times)
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [step_s, step_s, step_s]
    return StepTiming(
        attn=setup.label,
        task=setup.task,
        protocol=setup.protocol,
        precision=setup.precision,
        batch_size=setup.batch_size,
        seq_len=int(cfg.task.seq_len),
        step_s=step_s,
        step_spread_s=q[2] - q[0],
        steps_timed=len(times),
        eval_batch_s=eval_s,
        flops_step=setup.flops,
        matmul_flops_per_s=rate,
        limit_s=setup.flops / rate,
        ratio=step_s / (setup.flops / rate),
        protocol_h=_protocol_hours(cfg, step_s, eval_s),
        threads=torch.get_num_threads(),
        device=str(setup.device),
        load_1m=load,
    )


def time_protocol(
    *args: Any, steps: int = 6, warmup: int = 2, eval_batches: int = 3, rate: float | None = None, **kwargs: Any
) -> StepTiming:
    """Time one setup (`prepare(*args, **kwargs)`) alone: its training step and an evaluation batch."""
    return time_side_by_side([prepare(*args, **kwargs)], steps, warmup, eval_batches, rate)[0]


def kernel_overrides(attn: str, kernel: str | None, selector: str | None = None) -> list[str]:
    """The overrides that run `attn` (with its `selector`) on the `kernel` path (`fused` or `eager`): the encoder's
    `model.kernels`, and `attn.kernel` / `selector.kernel` where the attention or its selector has a compiled core
    of its own; none for None (the config's choices). An override given on the command line wins:
    `attn.kernel=fused --attn full --kernels fused eager` compares the encoder's chain alone."""
    if kernel is None:
        return []
    own = [
        f"{axis}.kernel={kernel}"
        for axis, registry, name in (("attn", ATTENTIONS, attn), ("selector", SELECTORS, selector))
        if name is not None and "kernel" in {f.name for f in fields(registry.config(name))}
    ]
    return [f"model.kernels={kernel}", *own]


def markdown(rows: list[StepTiming]) -> list[str]:
    """The table docs/results.md carries (one row per attention and precision)."""
    header = ["attention", "precision", "FLOPs/step", "matmul-limit time", "step", "step / limit", "eval batch"]
    body = [
        [
            r.attn,
            r.precision,
            f"{r.flops_step / 1e9:.1f} G",
            f"{r.limit_s:.2f} s",
            f"{r.step_s:.2f} s (IQR {r.step_spread_s:.2f}, {r.steps_timed} steps)",
            f"{r.ratio:.2f}×",
            f"{r.eval_batch_s:.2f} s",
            f"{r.protocol_h:.2f} h",
            f"{r.load_1m:.1f}",
        ]
        for r in rows
    ]
    return table([*header, "whole protocol", "load (1 min)"], body)


def where(device: torch.device) -> str:
    """The machine a timing belongs to: on a CPU its name, identity and the vector unit torch's kernels use (one
    name covers CPUs whose timings differ: "AMD EPYC" with AVX2 or with AVX-512)."""
    if device.type != "cpu":
        return torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    fields = cpu_fields()
    return f"cpu: {cpu_name(fields)} ({cpu_identity(fields)}, {torch.backends.cpu.get_cpu_capability()})"


def shown_command(argv: list[str]) -> str:
    """The command that made a measurement, as a document shows it: pasteable, without where its JSON went (a path
    of the machine it ran on) or the title (which the document prints above it)."""
    shown, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--json", "--title"):
            skip = True
        elif not arg.startswith(("--json=", "--title=")):
            shown.append(arg)
    return shlex.join(["python", "-m", "lra_bench.bench.step", *shown])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="listops")
    parser.add_argument("--attn", nargs="+", default=["nystrom", "gpa", "full"])
    parser.add_argument("--protocol", default="nystromformer")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: as a run picks them)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--precisions", nargs="+", default=["32-true"], help="e.g. 32-true bf16-mixed")
    parser.add_argument(
        "--dropout", nargs="+", default=["packed"], choices=["packed", "native"], help="native: torch's nn.Dropout"
    )
    parser.add_argument(
        "--kernels",
        nargs="+",
        default=[None],
        choices=["fused", "eager"],
        help="one row per path: model.kernels (and attn.kernel where the attention has it); default: the config's",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here (results_doc --step)")
    parser.add_argument("--title", default=None, help="what the measurement is (the machine's state): for the doc")
    parser.add_argument("overrides", nargs="*", help="config overrides (any change makes the timing off-protocol)")
    args = parser.parse_args(argv)

    runtime.set_threads(args.threads)
    device = resolve_device(args.device)
    rows = []
    for a in args.attn:
        for p in args.precisions:  # the variants of one attention and precision, timed round-robin
            extra = [*args.overrides, f"trainer.precision={p}"]
            setups = [
                prepare(args.task, a, args.protocol, extra, device, d, k) for d in args.dropout for k in args.kernels
            ]
            rows += time_side_by_side(setups, args.steps, args.warmup)
            del setups  # their networks and optimizer states, before the next attention's are built
    rates = sorted({r.matmul_flops_per_s / 1e9 for r in rows})
    conditions = (
        f"{args.task}, protocol {args.protocol}, on {where(device)} — fp32 matmul rate {rates[0]:.1f}"
        + (f"–{rates[-1]:.1f}" if len(rates) > 1 else "")
        + f" GFLOP/s (measured between the steps), {torch.get_num_threads()} thread(s)"
    )
    print(conditions)
    print("\n".join(markdown(rows)))
    if args.json:
        payload = {
            "title": f"{args.title + ': ' if args.title else ''}{conditions}",
            "command": shown_command(sys.argv[1:] if argv is None else argv),
            "rows": [asdict(r) for r in rows],
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
