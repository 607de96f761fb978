"""What the GPU check runs, in one place: the stage budgets and every size, for the GPU node and for `--tiny`.

The tiny plan runs the very same stages and commands on a CPU with everything shrunk, so the script is known to
work before GPU time is spent on it. The GPU budgets add up to the node's 9 minutes (see `total_budget_s`); a
stage may end early, never late.

Why these GPU settings:
- The ListOps row is the Nyströmformer protocol as `run.py` composes it (5000 steps, batch 32, validation every
  50 steps on 62 batches, test on the best-val checkpoint), with `trainer=gpu` (bf16-mixed) and `logger=csv`
  (W&B is not carried). Only the diagnostics are lighter: at the default probe (2 sequences cut to 1024 tokens,
  fp64 SVDs of every layer and head) each validation that improves val/acc would add seconds; a 256-token probe
  every 20th validation (and at every improvement, which the callback always does) keeps them in the record at a
  small cost.
- The three runs share the one GPU (each is launch-bound at this model size) while the correctness stages run
  beside them on the CPU cores; the bench runs alone afterwards, so its timings see an idle GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LISTOPS_ATTNS = ("full", "nystrom", "gpa")
# Nyströmformer Table 3 names for our attentions (the published row each run is shown beside).
PUBLISHED_SOURCE = "nystromformer_t3"


@dataclass(frozen=True)
class Plan:
    mode: str  # "gpu" | "tiny"
    budgets: dict[str, float]  # seconds per stage (the side stages run inside listops_train's window)
    total_budget_s: float
    gen_workers: int | None  # None = all cores (the generator caps them)
    listops_gen: dict[str, int]  # the generator knobs of the ListOps data (task.gen_*)
    listops_train: list[str]  # run.py overrides common to the three runs (besides attn, paths, run_name)
    smoke_gen: dict[str, int]
    smoke_train: list[str]
    fast_tier_tests: list[str]
    bench_common: list[str]
    step_args: list[str] = field(default_factory=list)  # `python -m lra_bench.bench.step` arguments
    bench_dtypes: tuple[str, ...] = ("bfloat16", "float32")
    train_threads: int = 2  # OMP threads per training process (the CPU side is data collation only)
    notes: list[str] = field(default_factory=list)

    def gen_overrides(self, knobs: dict[str, int]) -> list[str]:
        return [f"task.gen_{key}={value}" for key, value in knobs.items()]


# The correctness stages run inside the training window; their budgets are caps within it.
SIDE_STAGES = ("gpu_tests", "fast_tier", "bf16_smoke")

GPU = Plan(
    mode="gpu",
    budgets={
        "wheels": 30,
        "env": 15,
        "listops_data": 90,
        "listops_train": 280,
        "gpu_tests": 80,
        "fast_tier": 110,
        "bf16_smoke": 80,
        "bench_bfloat16": 40,
        "bench_float32": 35,
        "train_step": 25,
        "table": 15,
    },
    total_budget_s=530,  # wheels+env+data+train+bench+table; check.sh's own setup takes seconds
    gen_workers=None,
    listops_gen={},  # the official size: 96k/2k/2k, lengths 500…2000, depth 10, 10 arguments
    listops_train=[
        "trainer=gpu",
        "diagnostics.max_len=256",
        "diagnostics.every_n_validations=20",
    ],
    smoke_gen={"num_train": 256, "num_val": 32, "num_test": 32, "min_length": 64, "max_length": 512},
    smoke_train=[
        "trainer=gpu",
        "task.max_length=512",
        "task.seq_len=512",
        "data.batch_size=16",
        "trainer.max_steps=30",
        "trainer.val_check_interval=15",
        "trainer.limit_val_batches=2",
        "trainer.log_every_n_steps=1",  # every step's loss in the CSV: the smoke checks each is finite
        "optim.warmup_steps=5",
        "diagnostics.max_len=128",
    ],
    # The fast-tier files whose code picks the device by itself (run.py with trainer.accelerator=auto, the bench
    # with device=auto): on the node they train and measure on CUDA. The rest of the fast tier passes CPU tensors
    # explicitly (oracles, tokenizers, generators, config composition) and has its CUDA counterpart in
    # tests/test_gpu.py, which the gpu_tests stage runs.
    fast_tier_tests=["tests/test_run.py", "tests/test_reliability.py", "tests/test_bench.py"],
    notes=[
        "ListOps diagnostics: a 256-token probe at every 20th validation and at each val/acc improvement "
        "(the default 1024-token probe at every validation adds seconds of fp64 SVDs per validation, 100 of them "
        "in 5000 steps); everything else is the protocol as run.py composes it",
        "ListOps step times: three runs share one GPU, beside the gpu_tests, fast_tier and bf16_smoke stages",
    ],
    step_args=[
        *("--device", "cuda", "--attn", "full", "nystrom", "gpa", "--precisions", "32-true", "bf16-mixed"),
        *("--steps", "5", "--warmup", "2"),
    ],
    bench_common=[
        "device=cuda",
        "attns=[full,nystrom,gpa,spectral,pivoted,skyformer]",
        "landmarks=[64]",
        "references=[sdpa_flash,sdpa_efficient]",
        "seq_lens=[1024,2048,4096,8192,16384,32768]",
        "batch_size=8",
        "warmup=2",
        "repeats=10",
        "min_repeats=3",
        "max_time_s=0.3",
        "isolate=false",  # CUDA peaks are per-process tensor counters, reset per phase: no fork needed
        "count_flops=true",
        "count_flops_max_n=2048",
        "profile.enabled=false",
        "plots=false",
    ],
)

TINY = Plan(
    mode="tiny",
    budgets={
        "wheels": 30,
        "env": 30,
        "listops_data": 60,
        "listops_train": 300,
        "gpu_tests": 90,
        "fast_tier": 150,
        "bf16_smoke": 150,
        "bench_bfloat16": 60,
        "bench_float32": 60,
        "train_step": 40,
        "table": 20,
    },
    total_budget_s=640,
    gen_workers=2,  # the parallel generator path, even on a 2-core CI machine
    listops_gen={
        "num_train": 320,
        "num_val": 32,
        "num_test": 32,
        "min_length": 8,
        "max_length": 128,
        "max_depth": 5,
        "max_args": 5,
    },
    listops_train=[
        "trainer=cpu",
        "task.max_length=128",
        "task.seq_len=128",
        "data.batch_size=8",
        "trainer.max_steps=20",
        "trainer.val_check_interval=10",
        "trainer.limit_val_batches=2",
        "optim.warmup_steps=2",
        "callbacks.stats_warmup_steps=2",
        "diagnostics.max_len=64",
    ],
    smoke_gen={"num_train": 64, "num_val": 16, "num_test": 16, "min_length": 8, "max_length": 128, "max_depth": 5},
    smoke_train=[
        "trainer=cpu",
        "trainer.precision=bf16-mixed",  # CPU autocast to bf16: the same fp32-core code path as on CUDA
        "task.max_length=128",
        "task.seq_len=128",
        "data.batch_size=8",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
        "trainer.limit_val_batches=1",
        "trainer.log_every_n_steps=1",
        "optim.warmup_steps=1",
        "callbacks.stats_warmup_steps=1",
        "diagnostics.max_len=32",
    ],
    fast_tier_tests=["tests/test_run.py"],
    step_args=[
        *("--device", "cpu", "--attn", "nystrom", "--steps", "1", "--warmup", "0", "--threads", "1"),
        *("task.seq_len=128", "task.max_length=100", "model.dim=16", "data.batch_size=4"),
    ],
    bench_common=[
        "device=cpu",
        "threads=1",
        "attns=[full,nystrom,gpa]",
        "landmarks=[16]",
        "references=[sdpa_flash]",  # memory-efficient attention has no CPU kernel
        "seq_lens=[64,128]",
        "batch_size=1",
        "warmup=1",
        "repeats=2",
        "min_repeats=1",
        "max_time_s=0.2",
        "isolate=false",
        "count_flops=false",
        "matmul.size=128",
        "profile.enabled=false",
        "plots=false",
    ],
    train_threads=1,
    notes=["tiny mode: CPU, everything shrunk — the numbers test the script, not the methods"],
)


def plan_for(tiny: bool) -> Plan:
    return TINY if tiny else GPU
