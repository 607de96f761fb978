"""`python -m lra_bench.compare`: a speed verdict only with an interval, and the machine load beside it.

Records are written by the compare tests' helper (`tests.test_compare.write_run`); the intervals are checked against
the method the docstring of `lra_bench.stats.speed` documents, computed here by hand, and its coverage by simulation.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from lra_bench.compare.cli import main
from lra_bench.stats.speed import OK, Timing, speed_ratio
from tests.test_compare import compare, planted, write_run


def _efficiency_section(stdout: str) -> str:
    return stdout.split("## Efficiency")[1].split("## Notes")[0]


def _pair(tmp: Path, seeds: int, step_a: list[float], step_b: list[float], **timing: Any) -> None:
    """gpa vs nystrom (same model size) on ListOps, `seeds` seeds, with the given median step times."""
    rng = np.random.default_rng(40)
    for seed in range(seeds):
        a, b = planted(rng, 0.4, 0.4)
        metrics_a = {k[:-2]: v[seed] for k, v in timing.items() if k.endswith("_a")}
        metrics_b = {k[:-2]: v[seed] for k, v in timing.items() if k.endswith("_b")}
        write_run(tmp / f"a{seed}", attn="gpa", seed=seed, correct=a, step_s=step_a[seed], metrics=metrics_a)
        write_run(tmp / f"b{seed}", attn="nystrom", seed=seed, correct=b, step_s=step_b[seed], metrics=metrics_b)


def test_one_timed_step_each_gives_no_speed_verdict(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The reported case: one timed step each (max_steps=6, 5 warm-up steps) on a loaded machine used to print
    "B is 23.42× faster" for two models of the same size."""
    _pair(tmp_path, 1, [0.4684], [0.0200], timed_steps_a=[1], timed_steps_b=[1], step_time_iqr_s_a=[0.0],
          step_time_iqr_s_b=[0.0], load_avg_1m_a=[3.91], load_avg_1m_b=[0.12])  # fmt: skip
    out = tmp_path / "c.json"
    code, stdout, stderr = compare(capsys, "attn=gpa", "attn=nystrom", "--in", str(tmp_path), "--json", str(out))
    assert code == 0, stderr
    efficiency = _efficiency_section(stdout)
    assert "faster" not in efficiency
    assert "A/B 23.42×: too few timed steps to tell (needs ≥ 10 timed steps in every run)" in efficiency
    assert "timed steps per run A 1, B 1" in efficiency
    assert "machine load while timing (1-min load average, 2 CPUs) A 3.91, B 0.12" in efficiency
    assert "too few steps" in stdout.split("## Verdicts")[0]  # the table's step-time cell
    task = json.loads(out.read_text())["tasks"][0]["efficiency"]
    assert task["step_time_ratio"] == pytest.approx(23.42)
    assert task["step_time_ratio_ci"] is None and task["faster"] is None
    assert task["speed_status"] == "too few timed steps"
    assert task["load_avg_1m_a"] == [3.91] and task["load_avg_1m_b"] == [0.12]


def _log_se(median: float, n: int, iqr: float) -> float:
    """The documented SE of log(median): √(π/2)·(IQR/1.349)/(√n·median)."""
    return math.sqrt(math.pi / 2) * iqr / (2 * stats.norm.ppf(0.75)) / (math.sqrt(n) * median)


def test_enough_timed_steps_give_a_ratio_with_its_interval(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _pair(tmp_path, 1, [0.030], [0.040], timed_steps_a=[50], timed_steps_b=[80], step_time_iqr_s_a=[0.006],
          step_time_iqr_s_b=[0.004], load_avg_1m_a=[0.5], load_avg_1m_b=[None])  # fmt: skip
    out = tmp_path / "c.json"
    code, stdout, stderr = compare(capsys, "attn=gpa", "attn=nystrom", "--in", str(tmp_path), "--json", str(out))
    assert code == 0, stderr
    se = math.hypot(_log_se(0.030, 50, 0.006), _log_se(0.040, 80, 0.004))
    expected = (0.75 * math.exp(-1.959964 * se), 0.75 * math.exp(1.959964 * se))
    eff = json.loads(out.read_text())["tasks"][0]["efficiency"]
    assert eff["step_time_ratio"] == pytest.approx(0.75)
    assert eff["step_time_ratio_ci"] == pytest.approx(expected, rel=1e-5)
    assert eff["faster"] == "A" and eff["timed_steps_a"] == [50] and eff["timed_steps_b"] == [80]
    text = _efficiency_section(stdout)
    assert f"A/B 0.75×, 95% CI {expected[0]:.2f}–{expected[1]:.2f}×: A is 1.33× faster" in text
    assert "timed steps per run A 50, B 80" in text and "A 0.50, B unknown" in text


def test_several_seeds_use_the_spread_across_runs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Tight runs whose medians differ from seed to seed: the across-run spread (Welch t on the log medians)
    sets the interval, and here it is too wide to call a winner."""
    step_a, step_b = [0.030, 0.045, 0.036], [0.040, 0.033, 0.050]
    _pair(tmp_path, 3, step_a, step_b, timed_steps_a=[200] * 3, timed_steps_b=[200] * 3,
          step_time_iqr_s_a=[1e-4] * 3, step_time_iqr_s_b=[1e-4] * 3)  # fmt: skip
    out = tmp_path / "c.json"
    code, stdout, stderr = compare(capsys, "attn=gpa", "attn=nystrom", "--in", str(tmp_path), "--json", str(out))
    assert code == 0, stderr
    la, lb = np.log(step_a), np.log(step_b)
    va, vb = la.var(ddof=1) / 3, lb.var(ddof=1) / 3
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    half = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
    ratio = math.exp(la.mean() - lb.mean())
    eff = json.loads(out.read_text())["tasks"][0]["efficiency"]
    assert eff["step_time_ratio"] == pytest.approx(ratio)
    assert eff["step_time_ratio_ci"] == pytest.approx([ratio * math.exp(-half), ratio * math.exp(half)], rel=1e-6)
    assert eff["faster"] is None and "no clear speed difference" in _efficiency_section(stdout)


def test_older_records_get_the_ratio_without_a_verdict(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(41)
    a, b = planted(rng, 0.4, 0.4)
    write_run(tmp_path / "a", attn="gpa", seed=0, correct=a, step_s=0.02, legacy_timing=True)
    write_run(tmp_path / "b", attn="nystrom", seed=0, correct=b, step_s=0.04, legacy_timing=True)
    code, stdout, stderr = compare(capsys, str(tmp_path / "a"), str(tmp_path / "b"))
    assert code == 0, stderr
    text = _efficiency_section(stdout)
    assert "A/B 0.50×: no interval, so no speed verdict" in text and "faster" not in text
    assert "older records" in text and "A unknown, B unknown" in text
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 0


def test_speed_interval_covers_the_true_ratio() -> None:
    """Simulated runs: 40 timed steps each, normal step times with a 10% sd (true median = mean); the interval of
    the ratio of the runs' medians covers the true ratio about 95% of the time."""
    rng = np.random.default_rng(42)
    draws, n, truth = 3000, 40, 0.8
    covered = 0
    for _ in range(draws):
        a = rng.normal(0.8, 0.08, n)
        b = rng.normal(1.0, 0.10, n)
        timings = [Timing(float(np.median(x)), n, float(np.subtract(*np.quantile(x, [0.75, 0.25])))) for x in (a, b)]
        result = speed_ratio(timings[:1], timings[1:])
        assert result.status == OK and result.ci is not None
        covered += result.ci[0] <= truth <= result.ci[1]
    rate = covered / draws
    se = math.sqrt(0.95 * 0.05 / draws)
    assert 0.95 - 4 * se - 0.01 <= rate <= 0.95 + 4 * se + 0.01, rate


def test_step_times_from_cpus_of_one_name_but_other_vector_units_are_not_compared() -> None:
    """Virtual machines name Zen 3 and Zen 5 alike ("AMD EPYC"); torch runs AVX2 kernels on one and AVX-512 on the
    other, so the record's hardware carries the CPU's identity and torch's capability, and a step-time ratio across
    them is refused."""
    import torch

    from lra_bench.compare.pairing import efficiency
    from lra_bench.record.provenance import hardware

    here = hardware()
    assert here["cpu_capability"] == torch.backends.cpu.get_cpu_capability()

    def record(capability: str) -> dict[str, Any]:
        metrics = {"step_time_median_s": 1.0, "timed_steps": 200, "step_time_iqr_s": 0.05, "load_avg_1m": 0.1}
        return {"metrics": metrics, "env": {"hardware": {**here, "cpu_capability": capability}}}

    assert efficiency([record("AVX2")], [record("AVX2")]).comparable
    apart = efficiency([record("AVX512")], [record("AVX2")])
    assert not apart.comparable and "different hardware" in apart.note
