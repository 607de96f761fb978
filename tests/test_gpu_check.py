"""The GPU node check (scripts/gpu/): its tiny CPU mode end to end, and the parts that must work the first time on
the node — the time box around each stage, the wheel install into a temp site, and every GPU-only override."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

CHECK = REPO / "scripts" / "gpu" / "check.sh"
STATUSES = {"passed", "failed", "timeout", "skipped"}
LISTOPS_ATTNS = ["full", "nystrom", "gpa"]
MAX_OUT_FILES = 8  # the device's transfer limit


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0): look at its state
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split(")")[-1].split()[0] != "Z"


def run_fn(tmp_path: Path, label: str, seconds: int, cmd: list[str]) -> tuple[int, float]:
    """check.sh's own `run LABEL SECONDS CMD...` (the script sourced: its functions, not its main)."""
    for sub in ("log", "pid", "rc"):
        (tmp_path / sub).mkdir(exist_ok=True)
    script = f"source {shlex.quote(str(CHECK))}; out={tmp_path}; work={tmp_path}; print=0; run {label} {seconds} "
    start = time.monotonic()
    proc = subprocess.run(["bash", "-c", script + shlex.join(cmd) + "; echo rc=$?"], capture_output=True, text=True)
    return int(proc.stdout.strip().rsplit("rc=", 1)[-1]), time.monotonic() - start


def test_a_stage_past_its_budget_is_stopped_with_its_children_and_keeps_its_output(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(120)\n"
    )
    code, seconds = run_fn(tmp_path, "slow", 3, [sys.executable, "-c", script])
    assert code == 124 and seconds < 60  # `timeout`'s code for a command stopped at its budget
    ms = (tmp_path / "rc" / "slow").read_text().split()[1]  # the log: its command, its output, how it ended
    assert (tmp_path / "log" / "slow.log").read_text().splitlines()[-2:] == ["started", f"exit 124 after {ms} ms"]
    log = (tmp_path / "stages.log").read_text()
    assert "[slow] started" in log and "[slow] exit 124" in log
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(grandchild), "the stage's own children must end with it"


def test_a_finished_stage_reports_its_exit_code(tmp_path: Path) -> None:
    code, _ = run_fn(tmp_path, "quick", 60, [sys.executable, "-c", "print('a'); print('b'); raise SystemExit(3)"])
    assert code == 3
    assert (tmp_path / "log" / "quick.log").read_text().splitlines()[1:3] == ["a", "b"]  # after its command line


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


def stages_only(tmp_path: Path, only: str, listing: str, wheels: Path) -> tuple[dict, Path]:
    """check.sh --only ONLY with `listing` as the wheel list; the report's stages by name, and the work dir."""
    (tmp_path / "wheels.txt").write_text(listing)
    env = {**os.environ, "PYTHON": sys.executable, "WHEEL_LIST": str(tmp_path / "wheels.txt")}
    cmd = [str(CHECK), "--tiny", "--only", only, "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")]
    # importing torch can take 30 s and more on a busy CI machine: these stages get 300 s here
    cmd += ["--wheels", str(wheels), "--stage-budget", "wheels=300", "--stage-budget", "env=300"]
    subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    return {s["name"]: s for s in report["stages"]}, tmp_path / "work"


def wheel_check(tmp_path: Path, extra_files: dict[str, str], requires: list[str], only: str = "wheels") -> tuple:
    wheels = tmp_path / "whl"
    wheels.mkdir(parents=True)
    files = {"lra_fixture_pkg/__init__.py": "VALUE = 42\n", **extra_files}
    write_wheel(wheels, "lra-fixture-pkg", "1.0", files, requires)
    listing = "# a dist the running Python lacks\nlra-fixture-pkg==1.0   lra_fixture_pkg\n"
    return stages_only(tmp_path, only, listing, wheels)


def test_missing_wheels_are_installed_into_a_temp_site_that_the_stages_see(tmp_path: Path) -> None:
    stages, work = wheel_check(tmp_path, {}, requires=["packaging>=20"], only="wheels,env")
    rec = stages["wheels"]
    assert rec["status"] == "passed", (rec["summary"], rec["log_tail"])
    assert rec["summary"] == (
        "installed lra-fixture-pkg==1.0; every listed module imports, torch from the node; 0 version ranges not met"
    )
    assert (work / "site" / "lra_fixture_pkg" / "__init__.py").exists()
    assert (work / "site" / "lra_fixture_pkg-1.0.dist-info").is_dir()
    assert stages["env"]["status"] == "passed" and stages["listops_data"]["status"] == "pending"
    pythonpath = json.loads((work / "env.json").read_text())["pythonpath"].split(os.pathsep)
    assert pythonpath[:2] == [str(work / "site"), str(REPO)]  # what every later stage imports from
    probe = subprocess.run([sys.executable, "-c", "import lra_fixture_pkg; print(lra_fixture_pkg.VALUE)"],
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)}, capture_output=True,
                           text=True, cwd=tmp_path)  # fmt: skip
    assert probe.stdout.strip() == "42", probe.stderr


def test_a_wheel_that_shadows_the_nodes_own_package_or_lacks_a_dependency_fails(tmp_path: Path) -> None:
    stages, _ = wheel_check(tmp_path / "a", {"rich/__init__.py": "raise ImportError('carried copy')\n"}, [])
    assert stages["wheels"]["status"] == "failed" and "shadows the node's rich" in stages["wheels"]["summary"]
    stages, _ = wheel_check(tmp_path / "b", {}, requires=["lra-no-such-dependency>=1"])
    summary = stages["wheels"]["summary"]
    assert stages["wheels"]["status"] == "failed" and "missing requirement" in summary, summary
    assert "lra-fixture-pkg 1.0 requires lra-no-such-dependency" in summary


def test_a_missing_wheel_names_the_prepare_script(tmp_path: Path) -> None:
    rec = stages_only(tmp_path, "wheels", "lra-never-built==9.9 lra_never_built\n", tmp_path)[0]["wheels"]
    assert rec["status"] == "failed" and "lra-never-built" in rec["summary"] and "prepare.sh" in rec["summary"]


def compose_cli(module_or_script: list[str], overrides: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *module_or_script, "--cfg", "job", *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_every_gpu_only_command_composes_before_gpu_time_is_spent() -> None:
    """The GPU plan's overrides never run on a CPU machine: compose each command so a typo fails here."""
    from omegaconf import OmegaConf

    from tests.conftest import compose

    env = {**os.environ, "PYTHON": sys.executable}
    plan = subprocess.run([str(CHECK), "--print-plan"], env=env, capture_output=True, text=True, timeout=120).stdout
    commands = {w[1]: w[2:] for w in map(shlex.split, plan.splitlines()) if w[0] == "command"}
    budgets = {w[1]: (int(w[2]), w[3:] == ["side"]) for w in map(str.split, plan.splitlines()) if w[0] == "budget"}
    total = int(next(line.split()[1] for line in plan.splitlines() if line.startswith("total ")))
    assert commands["listops-gpa"][:2] == [sys.executable, "run.py"]
    proc = compose_cli(["run.py"], commands["listops-gpa"][2:])
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = OmegaConf.create(proc.stdout)
    assert (cfg.trainer.max_steps, cfg.trainer.val_check_interval, cfg.trainer.limit_val_batches) == (5000, 50, 62)
    assert (cfg.trainer.precision, cfg.data.batch_size, cfg.task.seq_len, cfg.logger.wandb.enabled) == (
        "bf16-mixed", 32, 2048, False,
    )  # fmt: skip
    attns = next(a for a in commands["bf16_smoke"] if a.startswith("attn=")).removeprefix("attn=").split(",")
    assert attns == sorted(p.stem for p in (REPO / "conf" / "attn").glob("*.yaml"))  # every registered attention
    smoke = ["attn=nystrom" if a.startswith("attn=") else a for a in commands["bf16_smoke"][2:] if a != "-m"]
    proc = compose_cli(["run.py"], smoke)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert OmegaConf.create(proc.stdout).trainer.precision == "bf16-mixed"
    proc = compose_cli(["-m", "lra_bench.bench"], commands["bench_bfloat16"][3:])
    assert proc.returncode == 0, proc.stderr[-2000:]
    bench = OmegaConf.create(proc.stdout)
    assert bench.device == "cuda" and list(bench.references) == ["sdpa_flash", "sdpa_efficient"]
    assert max(bench.seq_lens) == 32768
    overrides = [a for a in commands["listops_data"] if a.startswith("task.")]
    assert compose(["task=listops", *overrides]).task.gen_num_train == 96_000
    assert list(budgets)[:4] == ["wheels", "env", "listops_data", "listops_train"] and len(budgets) == 11
    assert sum(b for b, side in budgets.values() if not side) == total <= 9 * 60
    assert sum(b for b, side in budgets.values() if side) <= budgets["listops_train"][0]
    # the gpu_tests stage collects one file (the whole suite took longer than its budget): every CUDA test is there
    assert commands["gpu_tests"][-3:] == ["-m", "gpu", "tests/test_gpu.py"]
    tests = (p for p in (REPO / "tests").glob("test_*.py") if p.name != Path(__file__).name)
    marked = {p.name for p in tests if "pytest.mark.gpu" in p.read_text()}
    assert marked == {"test_gpu.py"}, f"CUDA tests outside tests/test_gpu.py, which the GPU check never runs: {marked}"


def tiny_check(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(REPO)}
    cmd = [str(CHECK), "--tiny", "--out", str(out), "--work", str(work), *extra]
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
    assert {stages[s]["status"] for s in ("gpu_tests", "fast_tier", "bf16_smoke")} <= {"timeout", "skipped"}
    assert all(stages[s]["status"] == "passed" for s in ("listops_data", "bench_bfloat16", "bench_float32", "table"))
    rows = report["listops"]["rows"]
    assert [r["attn"] for r in rows] == LISTOPS_ATTNS
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
    assert list(stages) == [
        "wheels", "env", "listops_data", "listops_train", "gpu_tests", "fast_tier", "bf16_smoke", "bench_bfloat16",
        "bench_float32", "train_step", "table",
    ]  # fmt: skip
    assert all(s["status"] in STATUSES and s["seconds"] is not None for s in stages.values()), stages
    expected = {name: "passed" for name in stages} | {"gpu_tests": "skipped"}  # no CUDA device here
    assert {n: s["status"] for n, s in stages.items()} == expected, {
        n: (s["status"], s["summary"]) for n, s in stages.items()
    }
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert report["finished"] and report["hardware"].startswith("no CUDA device")

    rows = {r["attn"]: r for r in report["listops"]["rows"]}
    assert list(rows) == LISTOPS_ATTNS
    for row in rows.values():
        assert row["status"] == "completed" and row["steps"] == row["max_steps"] == 20
        assert 0 <= row["test_acc"] <= 100 and 0 <= row["val_acc"] <= 100 and row["step_ms"] > 0
    assert (rows["full"]["published"], rows["nystrom"]["published"], rows["gpa"]["published"]) == (37.10, 37.15, None)
    md = (out / "report.md").read_text()
    for attn, published in (("full", "37.10 (Standard)"), ("nystrom", "37.15 (Nyströmformer)")):
        line = next(line for line in md.splitlines() if line.startswith(f"| `{attn}` |"))
        assert published in line and re.search(r"\| \d+\.\d\d \|", line), line
    smoke = stages["bf16_smoke"]["details"]["attentions"]
    attns = sorted(p.stem for p in (REPO / "conf" / "attn").glob("*.yaml"))
    assert sorted(smoke) == attns and all(r["ok"] for r in smoke.values())
    assert stages["listops_data"]["details"]["splits"] == {"train": 320, "val": 32, "test": 32}
    assert stages["fast_tier"]["details"]["tests"] >= 2 and not stages["fast_tier"]["details"]["failed"]
    for dtype in ("bfloat16", "float32"):
        bench = json.loads((out / f"bench_{dtype}.json").read_text())
        assert bench["settings"]["dtype"] == dtype and all(r["status"] == "ok" for r in bench["rows"])
        assert f"## Attention benchmark on the device, {dtype}" in md
    curves = (out / "listops_curves.csv").read_text().splitlines()
    assert curves[0] == "attn,step,val/acc,val/loss,train/loss,train/acc"
    assert {line.split(",")[0] for line in curves[1:]} == set(LISTOPS_ATTNS)

    files = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert files == sorted(report["out_files"]) and len(files) <= MAX_OUT_FILES
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in files)
    assert "listops_train: passed" in (out / "check.log").read_text()
    assert "[listops-gpa]" in (out / "stages.log").read_text()
