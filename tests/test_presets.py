"""CPU-sized presets (`experiment=smoke`, `experiment=cpu_small`, `make demo`) and the warm-up warning.

A preset shrinks data, length, steps and warm-up together, so it must (1) learn — test accuracy above the majority
class by more than chance allows, on a real `run.py` process (slow tier) — and (2) exercise the lengths it states:
its generator knobs must produce sequences near `task.gen_max_length` (the old demo asked for 10–128 tokens with a
depth and arity whose trees never exceed 37). A run whose learning rate never leaves the warm-up trains, but warns
with one line in the console and in run.log (the silent failure of shrinking a protocol run by hand).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from scipy.stats import binomtest

from lra_bench.record.results import read_record
from tasks.generate.listops import generate
from tests.conftest import TINY_LISTOPS, compose, run_cli

PRESETS = ("smoke", "cpu_small", "demo")
WARNING = "[lra-bench] warning: optim.warmup_steps="


def tokens(source: str) -> int:
    """A ListOps row's length as the generator and the loader count it (parentheses are not tokens)."""
    return sum(1 for word in source.split() if word not in ("(", ")"))


@pytest.mark.parametrize("preset", PRESETS)
def test_a_preset_generates_the_lengths_it_states(preset: str) -> None:
    task = compose([f"experiment={preset}"]).task
    rows = generate(
        400,
        seed=int(task.gen_seed),
        max_depth=int(task.gen_max_depth),
        max_args=int(task.gen_max_args),
        min_length=int(task.gen_min_length),
        max_length=int(task.gen_max_length),
        progress=False,
        workers=1,
    )
    lengths = sorted(tokens(text) for text, _ in rows)
    assert lengths[-1] <= int(task.max_length)  # nothing is cut
    assert lengths[-1] >= 0.85 * int(task.gen_max_length), f"{preset}: longest {lengths[-1]} of {task.gen_max_length}"
    assert statistics.median(lengths) >= 0.3 * int(task.gen_max_length), (
        f"{preset}: median {statistics.median(lengths)}"
    )


@pytest.mark.parametrize("preset", ("smoke", "cpu_small"))
def test_a_preset_warms_up_within_its_steps_and_is_off_protocol(preset: str) -> None:
    cfg = compose([f"experiment={preset}"])
    assert int(cfg.optim.warmup_steps) <= 0.2 * int(cfg.trainer.max_steps)
    assert int(cfg.trainer.val_check_interval) <= int(cfg.trainer.max_steps) // 4  # a curve, not two points


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("preset", ("smoke", "cpu_small"))
def test_a_preset_learns_above_the_majority_class(tmp_path: Path, preset: str) -> None:
    """Test accuracy is above the majority share with a one-sided binomial p < 0.001 (the test set is a few hundred
    examples: the margin is judged against its sampling error, not a fixed number of points)."""
    proc = run_cli([f"experiment={preset}", "threads=1", "logger=csv", "print_config=false"], tmp_path, timeout=1700)
    (path,) = (tmp_path / "outputs").rglob("results.json")
    record = read_record(path)
    assert record["status"] == "completed" and record["off_protocol"] is True
    n, accuracy = record["metrics"]["test_examples"], record["metrics"]["test_acc"]
    majority = record["data"]["majority_share"]
    p = binomtest(round(accuracy * n), n, majority, alternative="greater").pvalue
    assert p < 1e-3, f"{preset}: test accuracy {accuracy:.3f} over {n} examples vs majority share {majority:.3f}"
    assert WARNING not in proc.stderr  # a preset's warm-up fits its schedule
    # the generated data reach the preset's stated lengths (what the run really read)
    task = record["config"]["task"]
    with open(tmp_path / "data" / "listops-1000" / "basic_train.tsv") as fh:
        lengths = [tokens(line.split("\t")[0]) for line in list(fh)[1:]]
    assert len(lengths) == task["gen_num_train"] and max(lengths) >= 0.85 * task["gen_max_length"]


def test_a_warm_up_longer_than_the_run_warns_once_in_the_console_and_run_log(tmp_path: Path) -> None:
    args = [*TINY_LISTOPS, "attn=full", "run_name=long-warmup", "optim.warmup_steps=10", "diagnostics.enabled=false"]
    proc = run_cli(args, tmp_path)
    warnings = [line for line in proc.stderr.splitlines() if line.startswith(WARNING)]
    assert len(warnings) == 1, proc.stderr[-3000:]
    assert "optim.warmup_steps=10 >= trainer.max_steps=4" in warnings[0] and "reaches 40% of optim.lr" in warnings[0]
    run_log = (tmp_path / "outputs" / "listops" / "full" / "long-warmup" / "run.log").read_text()
    assert warnings[0] in run_log
    # a warm-up inside the schedule says nothing (TINY_LISTOPS: 1 warm-up step of 4)
    quiet = run_cli([*TINY_LISTOPS, "attn=full", "run_name=short-warmup", "diagnostics.enabled=false"], tmp_path)
    assert WARNING not in quiet.stderr
