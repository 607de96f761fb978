"""`python -m lra_bench.compare` end to end on records and prediction files written here in the official formats.

Planted effects (known per-seed accuracies) are checked against independent computations: scipy's paired t-test on
the seed accuracies read back from the prediction files, scipy's exact binomial test per seed, ratios of the
records' own step times. Refusals must be one line naming the differing keys, with exit status 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from omegaconf import OmegaConf
from scipy import stats

from lra_bench.compare.cli import main
from lra_bench.record import predictions, results
from lra_bench.record.identity import config_identity, fingerprint
from tests.conftest import REPO, compose

N_TEST = 2000
_CONFIGS: dict[tuple[str, ...], dict[str, Any]] = {}


def _config(*overrides: str) -> dict[str, Any]:
    if overrides not in _CONFIGS:
        _CONFIGS[overrides] = OmegaConf.to_container(compose(list(overrides)), resolve=True)  # type: ignore[assignment]
    return json.loads(json.dumps(_CONFIGS[overrides]))


def write_run(
    out: Path,
    *,
    attn: str,
    seed: int,
    correct: np.ndarray | None,
    acc: float | None = None,
    task: str = "listops",
    overrides: tuple[str, ...] = (),
    step_s: float = 0.05,
    peak: float = 500.0,
    status: str = "completed",
    tuning: dict[str, Any] | None = None,
    labels: np.ndarray | None = None,
    identity: bool = True,
    legacy_timing: bool = False,
    metrics: dict[str, Any] | None = None,
    off_protocol: bool | None = False,
    deviations: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """A completed run's results.json (+ test_predictions.npz when `correct` is given) for `attn` and `seed`.

    The step-time keys a run records beside its median (`timed_steps`, `step_time_iqr_s`, `load_avg_1m`) default to
    200 timed steps with an IQR of 5% of the median on an idle machine; `legacy_timing` leaves them out (an older
    record). `metrics` overrides any metric; `off_protocol`/`deviations` are the conformance check's fields."""
    config = _config(f"attn={attn}", f"task={task}", *overrides)
    config["seed"] = seed
    if config.get("selector", {}).get("seed") is not None:
        config["selector"]["seed"] = seed
    if tuning is not None:
        config["tuning"] = tuning["tuning"]
        for key, value in tuning.get("values", {}).items():
            section, name = key.split(".")
            config[section][name] = value
    rec = results.empty_record()
    rec.update(
        status=status,
        task=task,
        attn=attn,
        selector=(config.get("selector") or {}).get("name") if attn != "full" else None,
        protocol="nystromformer",
        rank_budget=config["attn"].get("num_landmarks"),
        seed=seed,
        config=config,
    )
    if identity:
        rec["identity"] = config_identity(config)
        rec["fingerprint"] = fingerprint(rec["identity"])
    test_acc = float(correct.mean()) if correct is not None else acc
    rec["run"].update(name=out.name, output_dir=str(out), finished_at="2026-01-02T00:00:00")
    rec["metrics"].update(test_acc=test_acc, val_acc=test_acc, step_time_median_s=step_s, peak_memory_mib=peak)
    if correct is not None:
        rec["metrics"]["test_examples"] = int(correct.size)
    for key in ("timed_steps", "step_time_iqr_s", "load_avg_1m"):
        rec["metrics"].pop(key, None)
    if not legacy_timing:
        rec["metrics"].update(timed_steps=200, step_time_iqr_s=0.05 * step_s, load_avg_1m=0.1)
    rec["metrics"].update(metrics or {})
    rec.update(off_protocol=off_protocol, deviations=None if off_protocol is None else (deviations or {}))
    rec["env"] = {"hardware": {"cpu": "test cpu", "cpu_count": 2, "gpus": []}}
    results.write_atomic(out / results.FILENAME, rec)
    if correct is not None:
        label = labels if labels is not None else np.random.default_rng(1000).integers(0, 10, size=correct.size)
        predictions.save_predictions(out / predictions.FILENAME, label, np.where(correct, label, (label + 1) % 10))
    return out


def planted(rng: np.random.Generator, acc_a: float, acc_b: float, n: int = N_TEST) -> tuple[np.ndarray, np.ndarray]:
    """Correctness of A and B on n paired examples with (about) the given accuracies, positively correlated."""
    u = rng.random(n)
    return u < acc_a, (u + rng.normal(0, 0.3, n)) % 1.0 < acc_b


def run_compare(*args: str) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "lra_bench.compare", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return proc.returncode, proc.stdout, proc.stderr


def compare(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """The same command in this process (`run_compare` pays a Python start-up per call)."""
    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """GPA beats Nyström on ListOps by ~5 pp over three seeds (clear even after Holm's correction over the two
    tasks); on Text they are equal in expectation."""
    root = tmp_path_factory.mktemp("cmp")
    rng = np.random.default_rng(0)
    accs: dict[tuple[str, str], list[float]] = {}
    for task, gap in (("listops", 0.05), ("text", 0.0)):
        for seed in range(3):
            seed_effect = rng.normal(0, 0.01)
            a, b = planted(rng, 0.40 + gap + seed_effect, 0.40 + seed_effect)
            write_run(root / f"gpa_{task}_{seed}", attn="gpa", seed=seed, correct=a, task=task, step_s=0.02)
            write_run(root / f"nys_{task}_{seed}", attn="nystrom", seed=seed, correct=b, task=task, step_s=0.04)
            accs.setdefault((task, "gpa"), []).append(float(a.mean()))
            accs.setdefault((task, "nystrom"), []).append(float(b.mean()))
    out = root / "compare.json"
    code, stdout, stderr = run_compare("attn=gpa", "attn=nystrom", "--in", str(root), "--json", str(out))
    assert code == 0, stderr
    return {"root": root, "json": json.loads(out.read_text()), "stdout": stdout, "accs": accs}


def test_planted_difference_matches_independent_statistics(sweep: dict[str, Any]) -> None:
    listops = next(t for t in sweep["json"]["tasks"] if t["task"] == "listops")
    a, b = np.array(sweep["accs"][("listops", "gpa")]), np.array(sweep["accs"][("listops", "nystrom")])
    oracle = stats.ttest_rel(a, b)
    ci = oracle.confidence_interval(0.95)
    assert listops["seeds"] == [0, 1, 2]
    assert listops["delta"] == pytest.approx(float(np.mean(a - b)))
    assert listops["p"] == pytest.approx(float(oracle.pvalue))
    assert listops["ci"] == pytest.approx([float(ci.low), float(ci.high)])
    for seed in listops["per_seed"]:
        k, d = seed["n10"], seed["n10"] + seed["n01"]
        assert seed["mcnemar_p"] == pytest.approx(stats.binomtest(k, d, 0.5).pvalue)
        assert seed["n"] == N_TEST
    lo, hi = listops["bootstrap_ci"]
    assert lo < listops["delta"] < hi
    assert listops["significant"] and listops["verdict"].startswith("gpa / gpa (m=log2) beats nystrom")
    assert listops["efficiency"]["step_time_ratio"] == pytest.approx(0.5)  # 20 ms vs 40 ms, from the records


def test_report_has_one_verdict_per_task_and_the_average(sweep: dict[str, Any]) -> None:
    text = sweep["stdout"]
    verdicts = text.split("## Verdicts")[1].split("##")[0]
    lines = [line for line in verdicts.splitlines() if line.startswith("- ")]
    assert len(lines) == 3  # ListOps, Text, the average over 2 tasks
    assert "on ListOps by " in lines[0] and "(95% CI " in lines[0] and "3 seeds; paired t-test" in lines[0]
    assert "on the average over 2 tasks (ListOps, Text)" in lines[2]
    assert "Multiple comparisons: 2 tasks tested" in text and "Holm" in text
    assert "A is 2.00× faster" in text
    assert "untuned / untuned" in text
    average = sweep["json"]["average"]
    listops, text_task = sweep["json"]["tasks"]
    assert average["delta"] == pytest.approx((listops["delta"] + text_task["delta"]) / 2)
    assert average["test"].startswith("Welch")


def test_output_is_deterministic_and_the_seed_is_exposed(sweep: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "again.json"
    assert main(["attn=gpa", "attn=nystrom", "--in", str(sweep["root"]), "--json", str(out)]) == 0
    again = json.loads(out.read_text())
    assert again["tasks"] == sweep["json"]["tasks"]
    assert main(["attn=gpa", "attn=nystrom", "--in", str(sweep["root"]), "--json", str(out), "--seed", "5",
                 "--resamples", "2000"]) == 0  # fmt: skip
    other = json.loads(out.read_text())
    assert other["tasks"][0]["bootstrap_ci"] != sweep["json"]["tasks"][0]["bootstrap_ci"]
    assert other["tasks"][0]["ci"] == sweep["json"]["tasks"][0]["ci"]  # the t-interval does not resample


def test_refuses_runs_that_differ_in_more_than_method_and_seed(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    for seed in range(2):
        a, b = planted(rng, 0.4, 0.4)
        write_run(tmp_path / f"a{seed}", attn="gpa", seed=seed, correct=a)
        write_run(tmp_path / f"b{seed}", attn="nystrom", seed=seed, correct=b, overrides=("optim.lr=0.001",
                  "task.max_length=500"))  # fmt: skip
    code, stdout, stderr = run_compare("attn=gpa", "attn=nystrom", "--in", str(tmp_path))
    assert code == 2 and stdout == ""
    assert len(stderr.strip().splitlines()) == 1
    assert "optim.lr (A 0.0001; B 0.001)" in stderr and "task.max_length (A 2000; B 500)" in stderr
    assert "--allow-differ" in stderr
    code, _, stderr = run_compare("attn=gpa", "attn=nystrom", "--in", str(tmp_path), "--allow-differ", "optim.lr")
    assert code == 2 and "optim.lr" not in stderr and "task.max_length" in stderr
    assert main(["attn=gpa", "attn=nystrom", "--in", str(tmp_path), "--allow-differ", "optim.lr", "task"]) == 0


def test_method_specific_keys_may_differ_and_old_records_use_their_config(tmp_path: Path) -> None:
    """attn.num_landmarks and selector.* belong to the method; records without `identity` fall back to config."""
    rng = np.random.default_rng(2)
    for seed in range(2):
        a, b = planted(rng, 0.4, 0.4)
        write_run(tmp_path / f"a{seed}", attn="nystrom", seed=seed, correct=a, overrides=("attn.num_landmarks=32",),
                  identity=False)  # fmt: skip
        write_run(tmp_path / f"b{seed}", attn="gpa", seed=seed, correct=b, identity=False)
    code, stdout, stderr = run_compare("attn=nystrom", "attn=gpa", "--in", str(tmp_path))
    assert code == 0, stderr
    assert "resolved configs (4 of 4 records predate the identity field)" in stdout


def test_a_side_holding_two_experiments_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(3)
    for seed in range(2):
        for m in (32, 64):
            write_run(tmp_path / f"n{m}_{seed}", attn="nystrom", seed=seed, correct=planted(rng, 0.4, 0.4)[0],
                      overrides=(f"attn.num_landmarks={m}",))  # fmt: skip
        write_run(tmp_path / f"g{seed}", attn="gpa", seed=seed, correct=planted(rng, 0.4, 0.4)[0])
    code, _, stderr = compare(capsys, "attn=nystrom", "attn=gpa", "--in", str(tmp_path))
    assert code == 2 and "holds different experiments on listops: attn.num_landmarks (32, 64)" in stderr
    assert main(["attn=nystrom,attn.num_landmarks=32", "attn=gpa", "--in", str(tmp_path)]) == 0


def test_predictions_on_different_test_examples_are_refused(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    a, b = planted(rng, 0.4, 0.4)
    write_run(tmp_path / "a", attn="gpa", seed=0, correct=a)
    write_run(tmp_path / "b", attn="nystrom", seed=0, correct=b, labels=rng.integers(0, 10, size=N_TEST))
    code, _, stderr = run_compare(str(tmp_path / "a"), str(tmp_path / "b"))
    assert code == 2 and "not on the same test examples (labels differ at" in stderr and str(tmp_path / "b") in stderr


def test_one_seed_uses_mcnemar_and_says_what_it_covers(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(5)
    a, b = planted(rng, 0.46, 0.40)
    write_run(tmp_path / "a", attn="gpa", seed=0, correct=a)
    write_run(tmp_path / "b", attn="nystrom", seed=0, correct=b)
    out = tmp_path / "c.json"
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "--json", str(out)]) == 0
    task = json.loads(out.read_text())["tasks"][0]
    n10 = int(np.sum(a & ~b))
    assert task["test"] == "exact McNemar test"
    assert task["p"] == pytest.approx(stats.binomtest(n10, n10 + int(np.sum(~a & b)), 0.5).pvalue)
    assert "training-seed variance not covered" in task["verdict"]
    capsys.readouterr()


def test_without_prediction_files_compare_falls_back_to_seed_level(tmp_path: Path) -> None:
    for seed, (x, y) in enumerate(((0.41, 0.40), (0.43, 0.40), (0.42, 0.41))):
        write_run(tmp_path / f"a{seed}", attn="gpa", seed=seed, correct=None, acc=x)
        write_run(tmp_path / f"b{seed}", attn="nystrom", seed=seed, correct=None, acc=y)
    out = tmp_path / "c.json"
    assert main(["attn=gpa", "attn=nystrom", "--in", str(tmp_path), "--json", str(out)]) == 0
    task = json.loads(out.read_text())["tasks"][0]
    assert task["bootstrap_ci"] is None and task["p"] == pytest.approx(
        stats.ttest_rel([0.41, 0.43, 0.42], [0.40, 0.40, 0.41]).pvalue
    )
    assert any("no per-example test outputs" in n and "seed-level statistics only" in n for n in task["notes"])


def _tuning(budget: int, lr: float) -> dict[str, Any]:
    space = {"optim.lr": "tag(log, interval(1e-5, 3e-3))", "optim.warmup_steps": "int(interval(0, 2000))"}
    return {
        "tuning": {"role": "tuned", "search_dir": f"/searches/{lr}", "budget": budget, "sampler_seed": 0,
                   "space": space, "best_val_acc": 0.4},
        "values": {"optim.lr": lr, "optim.warmup_steps": 100},
    }  # fmt: skip


def test_tuned_sides_may_differ_in_their_tuned_values_only(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(6)
    for seed in range(2):
        a, b = planted(rng, 0.4, 0.4)
        write_run(tmp_path / "t" / f"a{seed}", attn="gpa", seed=seed, correct=a, tuning=_tuning(20, 3e-4))
        write_run(tmp_path / "t" / f"b{seed}", attn="nystrom", seed=seed, correct=b, tuning=_tuning(20, 1e-3))
        write_run(tmp_path / "u" / f"b{seed}", attn="nystrom", seed=seed, correct=b)
        write_run(tmp_path / "t5" / f"b{seed}", attn="nystrom", seed=seed, correct=b, tuning=_tuning(5, 1e-3))
    code, stdout, stderr = compare(capsys, str(tmp_path / "t" / "a0"), "attn=gpa", "--in", str(tmp_path / "t"))
    assert code == 2 and "A and B share 1 run(s)" in stderr  # a run on both sides: not a comparison
    code, stdout, stderr = compare(capsys, "attn=gpa", "attn=nystrom", "--in", str(tmp_path / "t"))
    assert code == 0, stderr
    assert "tuned / tuned" in stdout and "tuned (20 trials on the validation split; optim.lr=0.0003" in stdout
    code, _, stderr = compare(capsys, "attn=gpa", "attn=nystrom", "--in", str(tmp_path / "t"), str(tmp_path / "t5"))
    assert code == 2 and "holds different experiments" in stderr and "tuning.budget (20, 5)" in stderr
    code, _, stderr = compare(capsys, "attn=gpa", str(tmp_path / "t5"), "--in", str(tmp_path / "t"))
    assert code == 2 and "tuning.budget (A 20; B 5)" in stderr
    code, _, stderr = compare(capsys, "attn=gpa", str(tmp_path / "u"), "--in", str(tmp_path / "t"))
    assert code == 2 and "A is tuned and the other side is not" in stderr and "optim.lr (A 0.0003; B 0.0001)" in stderr


def test_bad_selectors_and_excluded_records(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(7)
    a, b = planted(rng, 0.4, 0.4)
    write_run(tmp_path / "a", attn="gpa", seed=0, correct=a)
    write_run(tmp_path / "b", attn="nystrom", seed=0, correct=b)
    write_run(tmp_path / "f", attn="full", seed=0, correct=b, status="failed")
    code, _, stderr = compare(capsys, "attn=gpx", "attn=nystrom", "--in", str(tmp_path))
    assert code == 2 and "attn=gpx" in stderr and "(attn values there: full, gpa, nystrom)" in stderr
    code, _, stderr = compare(capsys, "attn", "attn=nystrom", "--in", str(tmp_path))
    assert code == 2 and "not a selector (key=value" in stderr
    code, _, stderr = compare(capsys, "attn=full", "attn=nystrom", "--in", str(tmp_path))
    assert code == 2 and "matches no completed run" in stderr
    code, _, stderr = compare(capsys, "attn=gpa", "attn=nystrom", "--in", str(tmp_path / "nope"))
    assert code == 2 and "--in: no such directory" in stderr


@pytest.mark.skipif("evaluated" not in results.STATUSES, reason="the record schema has no `evaluated` status yet")
def test_evaluated_runs_are_compared_only_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(8)
    a, b = planted(rng, 0.4, 0.4)
    write_run(tmp_path / "e", attn="full", seed=0, correct=a, status="evaluated")
    write_run(tmp_path / "b", attn="nystrom", seed=0, correct=b)
    code, _, stderr = compare(capsys, "attn=full", "attn=nystrom", "--in", str(tmp_path))
    assert code == 2 and "matches no completed run" in stderr
    assert main(["attn=full", "attn=nystrom", "--in", str(tmp_path), "--include-evaluated"]) == 0
