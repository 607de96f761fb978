"""The benchmark app (`python -m lra_bench.bench`): tiny sweeps in seconds, output schema, budget skips,
error rows, the subprocess-per-configuration path once, and the pure helpers (FLOPs, slopes, verdicts)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import CONF, REPO

TINY = [
    "attns=[full,nystrom]",
    "seq_lens=[64,128]",
    "landmarks=[8]",
    "batch_size=1",
    "warmup=1",
    "repeats=2",
    "min_repeats=1",
    "matmul.size=128",
    "matmul.repeats=2",
    "matmul.warmup=1",
    "threads=1",
    "count_flops=false",
    "profile.enabled=false",
]

ROW_TYPES: dict[str, Any] = {
    "label": str,
    "attn": str,
    "kind": str,
    "n": int,
    "B": int,
    "H": int,
    "d": int,
    "mode": str,
    "status": str,
    "isolated": bool,
    "default_selector": bool,
}
OK_TYPES: dict[str, Any] = {
    "time_median_s": float,
    "time_q1_s": float,
    "time_q3_s": float,
    "time_iqr_s": float,
    "times_s": list,
    "repeats": int,
    "first_call_s": float,
    "peak_mem_bytes": int,
    "mem_baseline_bytes": int,
    "mem_method": str,
}


def run_bench(tmp_path: Path, overrides: list[str]) -> dict[str, Any]:
    """Compose conf/bench.yaml with `overrides` and run the app in this process."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from lra_bench.bench.__main__ import run

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("bench", overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        data = run(cfg, tmp_path)
    GlobalHydra.instance().clear()
    return data


def check_schema(data: dict[str, Any], out: Path) -> None:
    for key in ("schema_version", "command", "env", "settings", "matmul", "rows", "summary", "device", "threads"):
        assert key in data, key
    assert data["matmul"]["start"]["flops_per_s"] > 0
    for key in ("speedups", "pair_ratios", "slopes", "targets"):
        assert isinstance(data["summary"][key], list), key
    for row in data["rows"]:
        for key, typ in ROW_TYPES.items():
            assert isinstance(row[key], typ), (key, row)
        assert row["status"] in ("ok", "skipped", "error", "timeout")
        if row["status"] == "ok":
            for key, typ in OK_TYPES.items():
                assert isinstance(row[key], typ), (key, row)
            assert row["time_q1_s"] <= row["time_median_s"] <= row["time_q3_s"]
            assert row["peak_mem_bytes"] >= 0
    on_disk = json.loads((out / "bench.json").read_text())
    assert on_disk["rows"] == json.loads(json.dumps(data["rows"]))
    md = (out / "bench.md").read_text()
    assert "Targets" in md and "Speed-up against `full`" in md
    for name in data["plots"]:
        assert (out / name).stat().st_size > 0


def test_tiny_sweep_in_process(tmp_path: Path) -> None:
    tiny = [a for a in TINY if not a.startswith("profile.")]
    profile = ["profile.labels=['nystrom/segment_means/m=8']", "profile.steps=1"]
    data = run_bench(tmp_path, [*tiny, *profile, "isolate=false", "references=[sdpa_math]"])
    check_schema(data, tmp_path)
    assert [p["label"] for p in data["profiles"]] == ["nystrom/segment_means/m=8", "full"]
    assert all(p["n"] == 128 and p["top"] and 0 < p["top"][0]["share"] <= 1 for p in data["profiles"])
    labels = {r["label"] for r in data["rows"]}
    assert labels == {"full", "nystrom/segment_means/m=8", "sdpa_math"}
    assert all(r["status"] == "ok" for r in data["rows"]), [r for r in data["rows"] if r["status"] != "ok"]
    assert {r["mode"] for r in data["rows"]} == {"forward", "forward_backward"}
    assert any(s["label"] == "nystrom/segment_means/m=8" and s["n"] == 128 for s in data["summary"]["speedups"])
    assert sorted(data["plots"]) == sorted(
        f"{m}_{mode}.png" for m in ("time", "memory") for mode in ("forward", "forward_backward")
    )
    nys = next(r for r in data["rows"] if r["attn"] == "nystrom" and r["mode"] == "forward")
    assert nys["flops"] > 0 and nys["rate_fraction"] > 0


def test_every_registered_attention_is_swept(tmp_path: Path) -> None:
    """The sweep iterates the registry: every attention appears, and no configuration crashes the run."""
    from lra_bench.registry import ATTENTIONS

    data = run_bench(
        tmp_path,
        [
            *TINY,
            "attns=all",
            "seq_lens=[64]",
            "modes=[forward]",
            "isolate=false",
            "references=[]",
            "count_flops=false",
            "plots=false",
        ],
    )
    assert {r["attn"] for r in data["rows"]} == set(ATTENTIONS.names())
    failed = [(r["attn"], r.get("selector"), r.get("error")) for r in data["rows"] if r["status"] != "ok"]
    assert not failed, failed  # every configuration really ran (an error row would also carry the attention)


def test_budget_skip_and_errors_do_not_stop_the_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lra_bench.bench import worker

    real = worker.build_module

    def broken(spec: dict[str, Any], n: int) -> torch.nn.Module:
        if spec["attn"] == "nystrom":
            raise RuntimeError("boom (test)")
        return real(spec, n)

    monkeypatch.setattr(worker, "build_module", broken)
    budget = 0.0003  # GiB (≈ 315 kB): the n=128 configurations are estimated over it, the n=64 ones under
    data = run_bench(tmp_path, [*TINY, "isolate=false", "references=[sdpa_math]", f"memory_budget_gib={budget}"])
    rows = data["rows"]
    for r in rows:
        if r["mem_estimate_bytes"] > budget * 2**30:
            assert r["status"] == "skipped" and "budget" in r["note"], r
        else:
            assert r["status"] == ("error" if r["attn"] == "nystrom" else "ok"), r
    assert 128 in {r["n"] for r in rows if r["status"] == "skipped"}
    assert any(r["status"] == "error" and "boom (test)" in r["error"] for r in rows)
    assert any(r["status"] == "ok" for r in rows)
    assert "Skipped and failed" in (tmp_path / "bench.md").read_text()


@pytest.mark.slow
def test_cli_isolated_subprocess_per_config(tmp_path: Path) -> None:
    """The real command line, each configuration in its own (forked) process: peak RSS is per configuration."""
    out = tmp_path / "run"
    args = [a for a in TINY if not a.startswith("count_flops")]
    cmd = [sys.executable, "-m", "lra_bench.bench", *args, "seq_lens=[64]", "references=[]", f"hydra.run.dir={out}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "bench.json").read_text())
    check_schema(data, out)
    assert all(r["isolated"] and r["status"] == "ok" for r in data["rows"])
    assert all(r["mem_method"] in ("rss_hwm_reset", "ru_maxrss") for r in data["rows"])
    nys = next(r for r in data["rows"] if r["attn"] == "nystrom" and r["mode"] == "forward")
    assert nys["flops_counted"] is not None  # FlopCounterMode saw the plain matmuls


def test_peak_memory_probe_sees_an_allocation() -> None:
    from lra_bench.memory import PeakMemory

    meter = PeakMemory(torch.device("cpu"))
    meter.start()
    if meter.method != "rss_hwm_reset":
        pytest.skip("cannot reset the RSS high-water mark here")
    x = torch.ones(16 * 2**20)  # 64 MiB, touched
    del x
    peak, _, _ = meter.stop()
    assert 60 * 2**20 < peak < 200 * 2**20


def test_flops_table() -> None:
    from lra_bench.bench.costs import Point, attention_flops, extrapolate_memory
    from lra_bench.registry import UnknownComponent
    from models.cost import Flops

    f = attention_flops(Point("full", batch=2, heads=3, n=100, m=None, d=8))
    assert f is not None and f.forward == 4 * 2 * 3 * 100 * 100 * 8 and f.forward_backward == 3 * f.forward
    with pytest.raises(UnknownComponent):  # a typo is an error, not an "uncounted" method
        attention_flops(Point("no_such_attention", batch=1, heads=1, n=8, m=None, d=8))
    nys = attention_flops(
        Point("nystrom", batch=1, heads=1, n=1024, m=64, d=32, params={"conv_kernel": 0}, selector="uniform")
    )
    assert nys is not None and nys.forward > 8 * 1024 * 64 * 32
    assert (Flops(1.0, 2.0) + Flops(3.0)).forward_backward == 4.0 + 2.0 + 8.0
    assert extrapolate_memory([(100, 10.0), (200, 20.0)], 400) == pytest.approx(40.0)
    assert extrapolate_memory([(100, 10.0)], 200) == pytest.approx(40.0)  # one point: assume quadratic


def test_flops_agree_with_flop_counter_for_plain_matmul_methods() -> None:
    """For a method built only of matmuls the hand count equals torch's FlopCounterMode."""
    from lra_bench.bench.costs import Point, attention_flops
    from lra_bench.bench.worker import count_flops
    from lra_bench.registry import build_attention, build_selector

    n, m, d = 128, 16, 8
    att = build_attention(
        "nystrom",
        head_dim=d,
        num_heads=2,
        seq_len=n,
        selector=build_selector("uniform"),
        num_landmarks=m,
        conv_kernel=0,
    )
    q, k, v, g = (torch.randn(1, 2, n, d, requires_grad=True) for _ in range(4))
    counted = count_flops(att, "forward", q, k, v, None, g)
    hand = attention_flops(
        Point("nystrom", batch=1, heads=2, n=n, m=m, d=d, params={"conv_kernel": 0}, selector="uniform")
    )
    assert hand is not None and counted == pytest.approx(hand.forward, rel=1e-6)


def test_stats_and_slopes() -> None:
    from lra_bench.bench.stats import loglog_slope, mean_std, summarize

    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s["median"] == 3.0 and s["iqr"] == pytest.approx(2.0) and s["count"] == 5
    ns = [1024, 2048, 4096, 8192]
    assert loglog_slope(ns, [n**2 for n in ns]) == pytest.approx(2.0)
    assert loglog_slope(ns, [3 * n for n in ns], lo=2048, hi=8192) == pytest.approx(1.0)
    assert loglog_slope([1024], [1.0]) is None
    mean, std = mean_std([1.0, 3.0])
    assert mean == 2.0 and std == pytest.approx(math.sqrt(2))


def test_target_verdicts_from_rows() -> None:
    from lra_bench.bench.report import summarize_bench

    def row(label: str, attn: str, n: int, t: float, m: Any = None) -> dict[str, Any]:
        return dict(
            label=label, attn=attn, kind="attention", m=m, n=n, mode="forward_backward", status="ok",
            time_median_s=t, peak_mem_bytes=100 * n, rate_fraction=0.6, default_selector=True,
        )  # fmt: skip

    rows = []
    for n in (1024, 2048, 4096, 8192, 16384):
        rows.append(row("full", "full", n, 1e-6 * n * n))
        rows.append(row("nystrom/x/m=64", "nystrom", n, 1e-4 * n, 64))
        rows.append(row("gpa/y/m=64", "gpa", n, 2e-4 * n, 64))
    targets = dict(
        mode="forward_backward", speedup_vs_full={8192: 10},
        time_ratio_at_equal_m={"pair": ["gpa", "nystrom"], "max": 1.25}, loglog_slope_max=1.1,
        slope_range=[1024, 16384], matmul_rate_fraction_min=0.5, rate_n=16384,
    )  # fmt: skip
    settings = {"targets": targets}
    summary = summarize_bench(rows, settings)
    verdicts = {t["target"].split(" (")[0]: t for t in summary["targets"]}
    assert verdicts["speed-up vs full at n=8192"]["verdict"] == "met"  # 8192·1e-6·8192/(1e-4·8192) ≈ 82
    assert verdicts["gpa/nystrom time at equal m"]["verdict"] == "missed"  # 2×
    assert verdicts["time slope on log-log, n=1024…16384"]["verdict"] == "met"
    assert verdicts["achieved rate / matmul rate at n=16384"]["verdict"] == "met"


def test_a_child_whose_parent_stopped_listening_exits_quietly(capfd: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C or a timeout closes the parent's end of the pipe while the child still measures; the child's
    late result then has no reader. It must end quietly (exit 0), not print a BrokenPipe traceback."""
    from lra_bench.bench import sweep, worker

    ctx = sweep._context()
    recv, send = ctx.Pipe(duplex=False)
    spec = {"device": "cpu", "dtype": "float32", "kind": "attention", "attn": "no-such", "n": 8, "modes": ["forward"]}
    proc = ctx.Process(target=worker.child, args=(spec, send), daemon=True)
    proc.start()
    send.close()
    recv.close()  # the parent gave up before the child's result was ready
    proc.join(120)
    assert proc.exitcode == 0
    assert "Traceback" not in capfd.readouterr().err
