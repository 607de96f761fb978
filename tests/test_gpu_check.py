"""The GPU node check (scripts/gpu/): its tiny CPU mode end to end, and the parts that must work the first time on
the node — the time box around each stage, the wheel install into a temp site, and every GPU-only override."""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from scripts.gpu import plan as plans
from scripts.gpu.check import MAX_OUT_FILES, STAGES, Check
from scripts.gpu.runner import LogSink, run
from tests.conftest import REPO

STATUSES = {"passed", "failed", "timeout", "skipped"}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0): look at its state
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split(")")[-1].split()[0] != "Z"


def test_a_stage_past_its_budget_is_stopped_with_its_children_and_keeps_its_output(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(120)\n"
    )
    sink = LogSink(tmp_path / "stages.log")
    start = time.monotonic()
    outcome = run("slow", [sys.executable, "-c", script], sink, tmp_path, dict(os.environ), timeout_s=3, grace_s=2)
    sink.close()
    assert outcome.timed_out and outcome.returncode is None and not outcome.ok
    assert time.monotonic() - start < 60
    assert [line for _, line in outcome.tail] == ["started"]
    log = (tmp_path / "stages.log").read_text()
    assert "[slow] started" in log and "timed out" in log
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(grandchild), "the stage's own children must end with it"


def test_a_finished_stage_reports_its_exit_code(tmp_path: Path) -> None:
    sink = LogSink(tmp_path / "stages.log")
    outcome = run("quick", [sys.executable, "-c", "print('a'); print('b'); raise SystemExit(3)"], sink, tmp_path,
                  dict(os.environ), timeout_s=60)  # fmt: skip
    assert (outcome.returncode, outcome.timed_out) == (3, False)
    assert outcome.text() == "a\nb"


def write_wheel(folder: Path, dist: str, version: str, files: dict[str, str], requires: list[str]) -> Path:
    """A wheel in the PEP 427 layout (METADATA, WHEEL, RECORD with sha256 digests), written here."""
    stem = f"{dist.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    meta = "Metadata-Version: 2.1\n" + f"Name: {dist}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    contents = {
        **files,
        f"{info}/METADATA": meta,
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    path = folder / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in {**contents, f"{info}/RECORD": "\n".join(record) + "\n"}.items():
            zf.writestr(name, text)
    return path


def wheels_stage(tmp_path: Path, listing: str, wheels: Path) -> Check:
    """Run only the wheels stage of a tiny check, with `listing` as the wheel list."""
    (tmp_path / "wheels.txt").write_text(listing)
    args = argparse.Namespace(tiny=True, out=tmp_path / "out", work=tmp_path / "work", wheels=wheels, budget=None)
    check = Check(args)
    check.wheel_list = tmp_path / "wheels.txt"
    check.run_stage("wheels", check.stage_wheels)
    check.sink.close()
    return check


def wheel_check(tmp_path: Path, extra_files: dict[str, str], requires: list[str]) -> tuple[Check, dict]:
    wheels = tmp_path / "whl"
    wheels.mkdir(parents=True)
    files = {"lra_fixture_pkg/__init__.py": "VALUE = 42\n", **extra_files}
    write_wheel(wheels, "lra-fixture-pkg", "1.0", files, requires)
    check = wheels_stage(
        tmp_path, "# a dist the running Python lacks\nlra-fixture-pkg==1.0   lra_fixture_pkg\n", wheels
    )
    return check, json.loads((tmp_path / "out" / "report.json").read_text())


def test_missing_wheels_are_installed_into_a_temp_site_that_the_stages_see(tmp_path: Path) -> None:
    check, report = wheel_check(tmp_path, {}, requires=["packaging>=20"])
    rec = check.report.stage("wheels")
    assert rec.status == "passed", (rec.summary, rec.log_tail)
    assert rec.details["missing"] == ["lra-fixture-pkg"] and rec.details["installed"] == [
        "lra_fixture_pkg-1.0-py3-none-any.whl"
    ]
    assert check.site is not None and (check.site / "lra_fixture_pkg" / "__init__.py").exists()
    verdict = rec.details["verify"]
    assert verdict["versions"] == {"lra-fixture-pkg": "1.0"} and not verdict["torch_from_site"]
    probe = subprocess.run([sys.executable, "-c", "import lra_fixture_pkg; print(lra_fixture_pkg.VALUE)"],
                           env=check.env(), capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert probe.stdout.strip() == "42", probe.stderr
    assert report["stages"][0]["status"] == "passed"


def test_a_wheel_that_shadows_the_nodes_own_package_or_lacks_a_dependency_fails(tmp_path: Path) -> None:
    check, _ = wheel_check(tmp_path / "a", {"rich/__init__.py": "raise ImportError('carried copy')\n"}, [])
    rec = check.report.stage("wheels")
    assert rec.status == "failed" and "shadows the node's rich" in rec.summary
    check, _ = wheel_check(tmp_path / "b", {}, requires=["lra-no-such-dependency>=1"])
    rec = check.report.stage("wheels")
    assert rec.status == "failed" and "missing requirement lra-no-such-dependency" in rec.summary


def test_a_missing_wheel_names_the_prepare_script(tmp_path: Path) -> None:
    rec = wheels_stage(tmp_path, "lra-never-built==9.9 lra_never_built\n", tmp_path).report.stage("wheels")
    assert rec.status == "failed" and "lra-never-built" in rec.summary and "prepare.sh" in rec.summary


def compose_cli(module_or_script: list[str], overrides: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *module_or_script, "--cfg", "job", *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_every_gpu_only_command_composes_before_gpu_time_is_spent(tmp_path: Path) -> None:
    """The GPU plan's overrides never run on a CPU machine: compose each command so a typo fails here."""
    from omegaconf import OmegaConf

    from tests.conftest import compose

    args = argparse.Namespace(tiny=False, out=tmp_path / "out", work=tmp_path / "work", wheels=None, budget=None)
    check = Check(args)
    train = check.train_command("gpa")[2:]  # without python and run.py
    proc = compose_cli(["run.py"], train)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = OmegaConf.create(proc.stdout)
    assert (cfg.trainer.max_steps, cfg.trainer.val_check_interval, cfg.trainer.limit_val_batches) == (5000, 50, 62)
    assert (cfg.trainer.precision, cfg.data.batch_size, cfg.task.seq_len, cfg.logger.wandb.enabled) == (
        "bf16-mixed", 32, 2048, False,
    )  # fmt: skip
    smoke = [a for a in check.smoke_command(["nystrom"])[2:] if a != "-m"]
    proc = compose_cli(["run.py"], smoke)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert OmegaConf.create(proc.stdout).trainer.precision == "bf16-mixed"
    proc = compose_cli(["-m", "lra_bench.bench"], check.bench_command("bfloat16")[3:])
    assert proc.returncode == 0, proc.stderr[-2000:]
    bench = OmegaConf.create(proc.stdout)
    assert bench.device == "cuda" and list(bench.references) == ["sdpa_flash", "sdpa_efficient"]
    assert max(bench.seq_lens) == 32768
    overrides = [a for a in check.data_command() if a.startswith("task.")]
    assert compose(["task=listops", *overrides]).task.gen_num_train == 96_000
    budgets = plans.GPU.budgets
    sequential = sum(v for k, v in budgets.items() if k not in plans.SIDE_STAGES)
    assert sequential == plans.GPU.total_budget_s <= 9 * 60
    assert sum(budgets[k] for k in plans.SIDE_STAGES) <= budgets["listops_train"]


def tiny_check(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(REPO)}
    cmd = [str(REPO / "scripts/gpu/check.sh"), "--tiny", "--out", str(out), "--work", str(work), *extra]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=850)
    return proc, json.loads((out / "report.json").read_text())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_stage_out_of_time_is_stopped_and_the_report_still_says_what_ran(tmp_path: Path) -> None:
    """The training window is 4 s: too short for any tiny run to finish, so it must be stopped at its budget."""
    proc, report = tiny_check(tmp_path, "--stage-budget", "listops_train=4")
    stages = {s["name"]: s for s in report["stages"]}
    assert proc.returncode == 1 and report["finished"]
    assert stages["listops_train"]["status"] == "timeout"
    assert stages["listops_train"]["seconds"] < 4 + 2 * 20 + 15  # the window, SIGTERM grace and SIGKILL, cleanup
    assert {stages[s]["status"] for s in plans.SIDE_STAGES} <= {"timeout", "skipped"}
    assert all(stages[s]["status"] == "passed" for s in ("listops_data", "bench_bfloat16", "bench_float32", "table"))
    rows = report["listops"]["rows"]
    assert [r["attn"] for r in rows] == list(plans.LISTOPS_ATTNS)
    assert all(r["status"] != "completed" and r["test_acc"] is None for r in rows), rows
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| listops_train | **timeout** |" in md and "37.10 (Standard)" in md
    work = str(tmp_path / "work")
    left = [p for p in Path("/proc").glob("[0-9]*") if work in _cmdline(p)]
    assert not left, f"processes of the check still running: {[_cmdline(p) for p in left]}"


def _cmdline(proc_dir: Path) -> str:
    try:
        return (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_tiny_mode_runs_every_stage_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc, report = tiny_check(tmp_path)
    stages = {s["name"]: s for s in report["stages"]}
    assert list(stages) == [name for name, _ in STAGES]
    assert all(s["status"] in STATUSES and s["seconds"] is not None for s in stages.values()), stages
    expected = {name: "passed" for name in stages} | {"gpu_tests": "skipped"}  # no CUDA device here
    assert {n: s["status"] for n, s in stages.items()} == expected, {
        n: (s["status"], s["summary"]) for n, s in stages.items()
    }
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert report["finished"] and report["hardware"].startswith("no CUDA device")

    rows = {r["attn"]: r for r in report["listops"]["rows"]}
    assert list(rows) == list(plans.LISTOPS_ATTNS)
    for row in rows.values():
        assert row["status"] == "completed" and row["steps"] == row["max_steps"] == 20
        assert 0 <= row["test_acc"] <= 100 and 0 <= row["val_acc"] <= 100 and row["step_ms"] > 0
    assert (rows["full"]["published"], rows["nystrom"]["published"], rows["gpa"]["published"]) == (37.10, 37.15, None)
    md = (out / "report.md").read_text()
    for attn, published in (("full", "37.10 (Standard)"), ("nystrom", "37.15 (Nyströmformer)")):
        line = next(line for line in md.splitlines() if line.startswith(f"| `{attn}` |"))
        assert published in line and re.search(r"\| \d+\.\d\d \|", line), line
    smoke = stages["bf16_smoke"]["details"]["attentions"]
    assert set(smoke) == set(Check.smoke_attns()) and all(r["ok"] for r in smoke.values())
    assert stages["listops_data"]["details"]["splits"] == {"train": 320, "val": 32, "test": 32}
    assert stages["fast_tier"]["details"]["tests"] >= 2 and not stages["fast_tier"]["details"]["failed"]
    for dtype in plans.TINY.bench_dtypes:
        bench = json.loads((out / f"bench_{dtype}.json").read_text())
        assert bench["settings"]["dtype"] == dtype and all(r["status"] == "ok" for r in bench["rows"])
        assert f"## Attention benchmark on the device, {dtype}" in md

    files = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert files == sorted(report["out_files"]) and len(files) <= MAX_OUT_FILES
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in files)
    assert "listops_train: passed" in (out / "check.log").read_text()
    assert "[train_gpa]" in (out / "stages.log").read_text()
