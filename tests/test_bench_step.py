"""The training-step benchmark (`python -m lra_bench.bench.step`): the run's own network and optimizer step, its
FLOPs checked against hand counts, and the projection of the whole protocol from its parts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from lra_bench.bench import step as bench_step
from lra_bench.bench.machine import Yardstick
from tests.conftest import REPO

SMALL = ["task.seq_len=128", "task.max_length=100", "model.dim=16", "model.ffn_dim=32", "data.batch_size=4"]


def test_a_grouped_convolution_backward_counts_twice_its_forward() -> None:
    """Oracle: a depthwise (k×1) conv over N positions and C channels costs 2·B·N·C·k FLOPs forward; its backward
    (input and weight gradients) twice that — torch's formula would count the dense C×C conv."""
    from torch.utils.flop_counter import FlopCounterMode

    b, c, n, k = 2, 8, 64, 5
    x = torch.randn(b, c, n, 1, requires_grad=True)
    w = torch.randn(c, 1, k, 1, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.conv2d(x, w, padding=(k // 2, 0), groups=c).sum().backward()
    forward = 2 * b * n * c * k
    assert bench_step.counted_flops(counter.get_flop_counts()["Global"]) == pytest.approx(3 * forward)


def test_the_step_is_the_protocol_config_and_its_projection_adds_up() -> None:
    row = bench_step.time_protocol("listops", "nystrom", "nystromformer", SMALL, steps=2, warmup=1, eval_batches=1)
    cfg = bench_step.protocol_config("listops", "nystrom", "nystromformer", SMALL)
    assert (row.batch_size, row.seq_len, row.precision) == (4, 128, "32-true")
    assert row.flops_step > 0 and row.step_s > 0 and row.eval_batch_s > 0
    assert row.limit_s == pytest.approx(row.flops_step / row.matmul_flops_per_s)
    assert row.ratio == pytest.approx(row.step_s / row.limit_s)
    evaluations = cfg.trainer.max_steps // cfg.trainer.val_check_interval  # 5000 // 50 on the protocol
    expected = cfg.trainer.max_steps * row.step_s + evaluations * cfg.trainer.limit_val_batches * row.eval_batch_s
    assert row.protocol_h == pytest.approx(expected / 3600)


def test_the_counted_flops_match_the_model_by_hand() -> None:
    """Oracle: with full attention every FLOP is a matmul: forward = Σ 2·rows·in·out over the linear layers + the
    2 attention products (SDPA's CPU kernel included), backward twice the linear layers' and 2.5× attention's."""
    b, n, dim, ffn, h, d, depth = 4, 128, 16, 32, 2, 32, 2
    # without attention dropout (the protocol's 0.1 takes SDPA's CPU math path, which counts another backward)
    cfg = bench_step.protocol_config("listops", "full", "nystromformer", [*SMALL, "attn.dropout=0.0"])
    model = bench_step.faithful_network(cfg)
    batch = bench_step.random_batch(cfg, b, torch.Generator().manual_seed(0))
    from torch.utils.flop_counter import FlopCounterMode

    bench_step.count_cpu_sdpa()
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(model(batch), batch["label"]).backward()
    linear = 2 * b * n * (dim * 3 * h * d + h * d * dim + dim * ffn + ffn * dim)
    attention = 2 * 2 * b * h * n * n * d  # QKᵀ and PV; a flash backward recomputes QKᵀ: 5 products, not 4
    head = 2 * b * (dim * cfg.model.head_hidden + cfg.model.head_hidden * cfg.task.num_classes)
    expected = 3 * (depth * linear + head) + 3.5 * depth * attention
    assert bench_step.counted_flops(counter.get_flop_counts()["Global"]) == pytest.approx(expected)


def test_the_kernel_paths_are_timed_round_robin_in_one_process() -> None:
    """`--kernels fused eager`: each path of an attention is its own network (`model.kernels`, and `attn.kernel` /
    `selector.kernel` where the attention or its selector has it; a command-line override wins), and their steps
    alternate, so a load that changes while they run falls on both rows alike."""
    assert bench_step.kernel_overrides("nystrom", "fused") == ["model.kernels=fused"]
    assert bench_step.kernel_overrides("full", "eager") == ["model.kernels=eager", "attn.kernel=eager"]
    assert bench_step.kernel_overrides("full", None) == []
    assert bench_step.kernel_overrides("pivoted", "eager", "pivoted_qr") == [
        "model.kernels=eager",
        "attn.kernel=eager",
        "selector.kernel=eager",
    ]
    assert bench_step.kernel_overrides("nystrom", "eager", "uniform") == ["model.kernels=eager"]
    calls: list[tuple[str, int]] = []
    times = bench_step._round_robin(
        [lambda i: calls.append(("a", i)), lambda i: calls.append(("b", i))], 1, 2, torch.device("cpu")
    )
    assert calls == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)] and [len(t) for t in times] == [2, 2]
    setups = [
        bench_step.prepare("listops", "full", "nystromformer", [*SMALL, "attn.kernel=fused"], kernel=k)
        for k in ("fused", "eager")
    ]
    assert [(s.cfg.model.kernels, s.cfg.attn.kernel) for s in setups] == [("fused", "fused"), ("eager", "fused")]
    rows = bench_step.time_side_by_side(setups, steps=1, warmup=0, eval_batches=1)
    assert [r.attn for r in rows] == ["full (fused kernels)", "full (eager kernels)"]
    assert rows[0].flops_step == rows[1].flops_step and rows[0].load_1m == rows[1].load_1m


def test_the_matmul_rate_is_timed_on_the_second_yardstick_call_of_a_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """The yardstick's first call after a step can be slowed by what that step left behind (after full attention's
    eager step: a third of the rate); each round runs it twice and times the second. A clock that charges 3 s to
    the first call after a step and 1 s to any other: the rate is flops / 1 s."""
    after_step = {"now": False}

    def step(_: int) -> float:
        after_step["now"] = True
        return 2.0

    def yardstick(_: int) -> float:
        seconds = 3.0 if after_step["now"] else 1.0
        after_step["now"] = False
        return seconds

    monkeypatch.setattr(bench_step, "timed", lambda device, call, *args: call(*args))
    monkeypatch.setattr(bench_step, "matmul_yardstick", lambda device: Yardstick(yardstick, 2048, 10.0))
    cfg = OmegaConf.create(
        {"task": {"seq_len": 8}, "trainer": {"max_steps": 10, "val_check_interval": 5, "limit_val_batches": 1}}
    )
    setup = bench_step.Setup("x", "listops", "p", cfg, torch.device("cpu"), "32-true", 1, 40.0, step, lambda _: 0.5)
    (row,) = bench_step.time_side_by_side([setup], steps=3, warmup=1, eval_batches=1)
    assert row.matmul_flops_per_s == 10.0 and row.step_s == 2.0 and row.limit_s == 4.0


def test_a_compiled_core_is_charged_the_work_of_its_eager_form() -> None:
    """The FLOP counter cannot see the products inside a compiled core (polynomial attention's blocked features and
    their matmuls): a fused row's limit is its eager form's FLOPs, so the two paths' `step / limit` divide the same
    work."""
    from torch.utils.flop_counter import FlopCounterMode

    fused, eager = (bench_step.prepare("listops", "polynomial", extra=SMALL, kernel=k) for k in ("fused", "eager"))
    assert fused.flops == eager.flops
    with FlopCounterMode(display=False) as counter:
        fused.step(1)
    assert bench_step.counted_flops(counter.get_flop_counts()["Global"]) < fused.flops  # what the fused path shows


@pytest.mark.slow
def test_the_command_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "step.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lra_bench.bench.step",
            "--attn",
            "nystrom",
            "gpa",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--threads",
            "1",
            "--precisions",
            "32-true",
            "bf16-mixed",
            "--json",
            str(out),
            *SMALL,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    assert "| attention | precision | FLOPs/step |" in proc.stdout
    payload = json.loads(out.read_text())
    rows = payload["rows"]
    assert payload["command"].startswith("python -m lra_bench.bench.step --attn nystrom gpa")
    assert "--json" not in payload["command"] and str(tmp_path) not in payload["command"]  # no machine path
    assert [(r["attn"], r["precision"]) for r in rows] == [
        ("nystrom", "32-true"),
        ("nystrom", "bf16-mixed"),
        ("gpa", "32-true"),
        ("gpa", "bf16-mixed"),
    ]
    assert all(r["threads"] == 1 for r in rows)
    # the title names the vector unit the timings belong to (one CPU name covers AVX2 and AVX-512)
    assert f"{torch.backends.cpu.get_cpu_capability()})" in payload["title"]


def test_the_results_doc_carries_the_step_table_and_a_full_render_keeps_it(tmp_path: Path) -> None:
    from dataclasses import asdict

    from lra_bench.reports import results_doc

    row = bench_step.time_protocol("listops", "gpa", "nystromformer", SMALL, steps=1, warmup=0, eval_batches=1)
    measured = tmp_path / "step.json"
    measured.write_text(
        json.dumps({"title": "idle", "command": "python -m lra_bench.bench.step", "rows": [asdict(row)]})
    )
    doc = tmp_path / "results.md"
    doc.write_text("# Results\n\nbench numbers\n")
    results_doc.main(["--step", str(measured), "--out", str(doc)])
    text = doc.read_text()
    assert text.startswith("# Results\n\nbench numbers") and "| gpa | 32-true |" in text and "**idle**" in text
    results_doc.main(["--out", str(doc)])  # a full render without --step (the bench inputs absent here)
    assert "| gpa | 32-true |" in doc.read_text()
