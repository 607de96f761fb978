"""Record & identity end to end: real `run.py` / `python -m lra_bench.evaluate` processes on tiny generated ListOps.

Issue 9 (record & identity) and issue 11 item 1, one test (or more) per item:
1. eval-only tests exactly the given checkpoint (weights and GPA's codebook) → `evaluated` record;
2. a run dir holds one experiment (fingerprint), code version recorded, a changed code version warns on resume;
3. re-running a finished command leaves its record byte-identical; a resumed run merges its segments' efficiency;
4. impossible schedules are refused before training; `completed` only when the planned steps ran;
5. leaderboard rows are experiments (see also tests/test_record_identity.py for the table itself);
6. per-example test outputs (`test_predictions.npz`) for every run and evaluation;
7. a corrupt or foreign checkpoint is refused with one line; printed paths paste back unquoted.

The oracle for test numbers is `tests/oracle.py`: a plain forward pass in this process.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from lra_bench.record.predictions import load_predictions
from lra_bench.record.results import read_record
from tasks.cache import TOKENS_FILE
from tests.conftest import REPO, TINY_LISTOPS, fault, run_cli, write_listops
from tests.oracle import oracle

# GPA: its codebook is selector state held in buffers (item 1: it must come back with the weights)
ARGS = [*TINY_LISTOPS, "attn=gpa", "optim.lr=1e-2"]


def printed_dir(stdout: str) -> Path:
    """The run dir exactly as the summary prints it (so a test that reuses it checks that it pastes back)."""
    found = re.findall(r"^outputs:\s+(\S+)$", stdout, flags=re.M)
    assert found, stdout[-2000:]
    return Path(found[-1])


def last_line(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One tiny GPA run (validations at steps 2 and 4), by overrides only: its dir name is derived from them."""
    root = tmp_path_factory.mktemp("record")
    proc = run_cli(ARGS, root)
    out = printed_dir(proc.stdout)
    return {"root": root, "out": out, "record": read_record(out / "results.json"), "stdout": proc.stdout}


def step_of(ckpt: Path) -> int:
    return int(torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"])


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# -- items 1, 6, 7 ------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_eval_entry_tests_exactly_the_given_checkpoint(trained: dict[str, Any]) -> None:
    root, out, record = trained["root"], trained["out"], trained["record"]
    training_files = files_of(out)
    best = out / "checkpoints" / f"best-{record['metrics']['best_step']}.ckpt"
    other = next(  # a checkpoint of another step (last-prev at 2, last at 4): other weights, other numbers
        p
        for p in (out / "checkpoints" / "last.ckpt", out / "checkpoints" / "last-prev.ckpt")
        if step_of(p) != record["metrics"]["best_step"]
    )
    plain = root / "ckpts" / "best.ckpt"  # item 1 first, on a path any version of the CLI parses
    plain.parent.mkdir(exist_ok=True)
    shutil.copy(best, plain)
    losses = {}
    for ckpt in (plain, other):  # `other` under the printed run dir, pasted unquoted (item 7)
        proc = run_cli([*ARGS, "train=false", f"ckpt_path={ckpt}"], root)
        evaluated = printed_dir(proc.stdout)
        assert evaluated != out
        ev = read_record(evaluated / "results.json")
        labels, preds, loss = oracle(ckpt, root, ARGS)
        assert ev["metrics"]["test_loss"] == pytest.approx(float(loss.mean()), rel=1e-6)  # that checkpoint's
        assert ev["metrics"]["test_acc"] == float((preds == labels).mean())
        assert ev["status"] == "evaluated", ev["error"]
        assert ev["evaluation"]["checkpoint"] == str(ckpt) and ev["evaluation"]["checkpoint_step"] == step_of(ckpt)
        assert ev["evaluation"]["checkpoint_fingerprint"] == record["fingerprint"] == ev["fingerprint"]
        saved = load_predictions(evaluated / "test_predictions.npz")  # item 6, also for evaluations
        assert saved.label.tolist() == labels.tolist() and saved.pred.tolist() == preds.tolist()
        losses[ckpt.name] = ev["metrics"]["test_loss"]
        if ckpt == plain:  # the training run's own test of this checkpoint
            assert (ev["metrics"]["test_acc"], ev["metrics"]["test_loss"]) == (
                record["metrics"]["test_acc"],
                record["metrics"]["test_loss"],
            )
    assert losses[plain.name] != losses[other.name]

    # the module entry rebuilds the model from the checkpoint's own config; its record goes under <run>/eval/
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "lra_bench.evaluate", str(best), f"data_dir={root / 'data'}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ev = read_record(out / "eval" / best.stem / "results.json")
    assert ev["status"] == "evaluated" and ev["evaluation"]["checkpoint"] == str(best)
    assert (ev["metrics"]["test_acc"], ev["metrics"]["test_loss"]) == (
        record["metrics"]["test_acc"],
        record["metrics"]["test_loss"],
    )
    assert {k: v for k, v in files_of(out).items() if not k.startswith("eval/")} == training_files

    # only logistics may change in the module entry; train=false without a checkpoint is an error
    bad = subprocess.run(
        [sys.executable, "-m", "lra_bench.evaluate", str(best), "model.dim=32"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert bad.returncode == 2 and last_line(bad.stderr).startswith("error: model.dim: part of the checkpoint's")
    proc = run_cli([*ARGS, "train=false", "ckpt_path=null"], root, check=False)
    assert proc.returncode == 2 and last_line(proc.stderr).startswith("error: train=false needs ckpt_path=")

    # the leaderboard counts the training run once and lists the evaluations apart
    from lra_bench.leaderboard import build_leaderboard

    table = build_leaderboard([root / "outputs"], out_dir=root / "board", plots=False)
    assert [r["n"] for r in table["rows"]] == [1] and not table["failures"]
    assert len(table["evaluations"]) == 3


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_training_run_saves_its_test_predictions(trained: dict[str, Any]) -> None:
    from tasks.listops import read_listops_tsv

    out, record = trained["out"], trained["record"]
    saved = load_predictions(out / "test_predictions.npz")
    assert record["predictions"] == "test_predictions.npz"
    _, labels = read_listops_tsv(next((trained["root"] / "data").rglob("basic_test.tsv")))  # the raw test file
    assert saved.label.tolist() == labels.tolist()  # every example, in split order
    assert record["metrics"]["test_examples"] == len(labels) == 16
    assert saved.accuracy == record["metrics"]["test_acc"]
    best = out / "checkpoints" / f"best-{record['metrics']['best_step']}.ckpt"
    _, preds, loss = oracle(best, trained["root"], ARGS)
    assert saved.pred.tolist() == preds.tolist()
    assert record["metrics"]["test_loss"] == pytest.approx(float(loss.mean()), rel=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_corrupt_or_foreign_checkpoints_are_refused_before_training(trained: dict[str, Any]) -> None:
    root, out = trained["root"], trained["out"]
    best = root / "gpa.ckpt"
    shutil.copy(out / "checkpoints" / f"best-{trained['record']['metrics']['best_step']}.ckpt", best)
    proc = run_cli([*TINY_LISTOPS, "attn=full", f"ckpt_path={best}", "run_name=foreign"], root, check=False)
    line = last_line(proc.stderr)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert line.startswith(f'error: checkpoint {best} was made with attn.name="gpa"') and 'attn.name="full"' in line
    assert not (root / "outputs" / "listops" / "full" / "foreign" / "checkpoints").exists()  # nothing trained
    broken = root / "broken.ckpt"
    broken.write_bytes(best.read_bytes()[: best.stat().st_size // 2])
    proc = run_cli([*ARGS, f"ckpt_path={broken}", "run_name=broken"], root, check=False)
    assert proc.returncode == 2
    assert last_line(proc.stderr).startswith(f"error: ckpt_path={broken}: not a usable checkpoint")


# -- item 2 -----------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_another_experiment_in_the_same_folder_is_refused(trained: dict[str, Any]) -> None:
    root, out, record = trained["root"], trained["out"], trained["record"]
    before = files_of(out)
    other = write_listops(root / "other-data", train=64, evaluation=16, max_length=48)  # other trees, same sizes
    proc = run_cli([*ARGS, f"data_dir={other}"], root, check=False)  # same overrides, other data
    line = last_line(proc.stderr)
    assert proc.returncode == 2 and line.startswith(f"error: run dir {out} holds another experiment"), line
    assert "data.tokens" in line and "run_name=" in line
    assert "result record:" not in proc.stdout  # no summary: nothing ran
    after = files_of(out)
    for name in ("results.json", "identity.json", "checkpoints/last.ckpt", "test_predictions.npz"):
        assert after[name] == before[name], name
    stored = json.loads((out / "identity.json").read_text())
    assert stored["format"] == "lra-bench/run-identity/1" and stored["fingerprint"] == record["fingerprint"]
    assert stored["identity"] == record["identity"]
    digests = {json.loads(p.read_text())["digest"] for p in root.rglob(TOKENS_FILE)}  # the two data's caches
    assert len(digests) == 2 and record["identity"]["data.tokens"] in digests
    assert "data_dir" not in record["identity"] and "data.source" not in record["identity"]
    assert set(record["code"]) == {"commit", "dirty"}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_resume_with_changed_code_warns_and_records_both_versions(tmp_path: Path) -> None:
    """A copy of the repository as its own git checkout: segment 1 at a clean commit, segment 2 with a tracked file
    edited (dirty). The resume warns, and the record keeps both segments' code versions."""
    repo = tmp_path / "repo"
    ignore = shutil.ignore_patterns(".git", ".venv", "outputs", "multirun", "data", "__pycache__", "*.egg-info")
    shutil.copytree(REPO, repo, ignore=ignore)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "segment 1"]):
        subprocess.run([*git, *cmd], cwd=repo, check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(repo), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    args = [*ARGS, "trainer.max_steps=6", "run_name=code"]  # run_name: `+fault` would otherwise name another dir
    args += [f"output_root={tmp_path / 'outputs'}", f"data_dir={tmp_path / 'data'}"]

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(repo / "run.py"), *args, *extra],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    first = run(*fault(nan_loss_at_step=5))  # stops in step 5: last.ckpt at step 4, status failed
    assert first.returncode != 0 and "loss is nan" in first.stderr
    with open(repo / "README.md", "a") as fh:
        fh.write("\nedited between the segments\n")
    second = run()
    assert second.returncode == 0, second.stderr[-3000:]
    assert "the code changed since" in second.stderr and "-dirty" in second.stderr
    record = read_record(printed_dir(second.stdout) / "results.json")
    assert record["status"] == "completed" and record["run"]["resumed_from_step"] == 4
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert [s["from_step"] for s in record["run"]["segments"]] == [0, 4]
    assert [s["code"] for s in record["run"]["segments"]] == [
        {"commit": commit, "dirty": False},
        {"commit": commit, "dirty": True},
    ]
    assert record["code"] == {"commit": commit, "dirty": True}


# -- item 3 -----------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_rerunning_a_completed_run_leaves_its_record_byte_identical(trained: dict[str, Any]) -> None:
    root, out = trained["root"], trained["out"]
    before = files_of(out)
    proc = run_cli(ARGS, root)  # the same command again
    after = files_of(out)
    for name in ("results.json", "test_predictions.npz", "checkpoints/last.ckpt", "identity.json"):
        assert after[name] == before[name], name
    assert printed_dir(proc.stdout) == out and "already completed" in proc.stdout
    assert "test accuracy (best-val ckpt)" in proc.stdout  # its summary
    # the explicit option tests the best checkpoint again; what training measured stays as it was
    old = read_record(out / "results.json")
    run_cli([*ARGS, "retest=true"], root)
    new = read_record(out / "results.json")
    assert new["status"] == "completed" and new["run"]["finished_at"] >= old["run"]["finished_at"]
    assert new["metrics"] == old["metrics"] and new["fingerprint"] == old["fingerprint"]
    assert files_of(out)["test_predictions.npz"] == before["test_predictions.npz"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_resumed_run_merges_the_efficiency_of_its_segments(tmp_path: Path) -> None:
    args = [*ARGS, "trainer.max_steps=6", "run_name=segments"]
    failed = run_cli([*args, *fault(nan_loss_at_step=5)], tmp_path, check=False)  # segment 1: steps 1-4
    assert failed.returncode != 0
    out = tmp_path / "outputs" / "listops" / "gpa" / "segments"
    first = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert first["global_step"] == 4
    first_state = first["callbacks"]["EfficiencyMonitor"]
    assert len(first_state["step_times"]) == 3  # steps 2..4 (step 1 is warm-up)
    proc = run_cli(args, tmp_path)  # segment 2: steps 5, 6 (5 is warm-up again)
    record = read_record(printed_dir(proc.stdout) / "results.json")
    state = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["callbacks"][
        "EfficiencyMonitor"
    ]
    assert state["step_times"][:3] == first_state["step_times"]  # segment 1's samples kept, not dropped
    assert len(state["step_times"]) == 4 and state["segments"] == 2
    m = record["metrics"]
    assert m["step_time_median_s"] == statistics.median(state["step_times"])
    assert m["tokens_per_s"] == pytest.approx(statistics.median(state["tokens_per_step"]) / m["step_time_median_s"])
    busy = sum(state["step_times"]) + sum(state["data_waits"])
    assert m["data_share"] == pytest.approx(sum(state["data_waits"]) / busy)
    assert m["peak_memory_mib"] >= round(first_state["peak_memory_mib"], 1)


# -- item 4 -----------------------------------------------------------------------------------------------------
@pytest.mark.timeout(600)
def test_a_batch_larger_than_the_train_split_is_refused(tmp_path: Path) -> None:
    proc = run_cli([*ARGS, "data.batch_size=128", "run_name=big-batch"], tmp_path, check=False)
    line = last_line(proc.stderr)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert line.startswith("error: the train split has 64 examples: with data.batch_size=128 that is 0 optimizer")
    assert "trainer.max_steps=4" in line and "Traceback" not in proc.stderr
    out = tmp_path / "outputs" / "listops" / "gpa" / "big-batch"
    assert read_record(out / "results.json")["status"] == "failed" and not (out / "checkpoints").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_completed_only_when_the_planned_steps_ran(tmp_path: Path) -> None:
    proc = run_cli(  # Lightning's max_time ends fit() early without an exception
        [*ARGS, "trainer.max_steps=40", "+trainer.max_time={seconds:4}", *fault(step_sleep_s=0.5), "run_name=t"],
        tmp_path,
        check=False,
    )
    assert proc.returncode != 0
    record = read_record(tmp_path / "outputs" / "listops" / "gpa" / "t" / "results.json")
    assert record["status"] == "failed" and "of trainer.max_steps=40 planned steps" in record["error"]
    assert record["metrics"]["test_acc"] is None
    proc = run_cli([*ARGS, "trainer.val_check_interval=10", "run_name=v"], tmp_path, check=False)
    line = last_line(proc.stderr)
    assert proc.returncode == 2 and line.startswith("error: trainer.val_check_interval=10 (10 steps) > trainer.max")


# -- item 5 -----------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_sweep_over_steps_gives_one_row_per_experiment(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    run_cli(
        [
            "-m",
            *ARGS,
            "trainer.max_steps=4,6",
            "seed=0,1",
            f"hydra.sweep.dir={sweep}",
            "hydra.callbacks.leaderboard.plots=false",
        ],
        tmp_path,
    )
    with open(sweep / "leaderboard.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["n"], r["seeds"]) for r in rows] == [("2", "0,1"), ("2", "0,1")]  # two experiments, not one pool
    assert sorted((r["variant"], r["n"], r["seeds"]) for r in rows) == [
        ("trainer.max_steps=4", "2", "0,1"),
        ("trainer.max_steps=6", "2", "0,1"),
    ]
    assert all(r["off_protocol"] == "True" and "trainer.max_steps" in r["deviations"] for r in rows)
    md = (sweep / "leaderboard.md").read_text()
    beside = md.split("### protocol: nystromformer")[1].split("####")[0]
    assert "| ours |" not in beside and "Superseded" not in md  # smoke runs never beside the paper's numbers
