"""Every command block of README.md runs, as written, so the README cannot rot.

The commands are read from the README's ```bash blocks at test time (a command added there is run here without
editing this file) and run in a scratch dir, one after another, each with exit status 0. What is documented here
and nowhere else is how each is *shrunk* so the whole README runs in minutes on 2 CPU cores:

* the data are tiny copies in the official formats under `data/` (ListOps TSVs, aclImdb, cifar-10-batches-py),
  written by the tests;
* `python run.py …` gets `SHRINK_RUN` (a tiny model, 4 steps, no diagnostics, CSV only) plus its task's lengths
  (`SHRINK_TASK`), `tuning.budget=2` for a search and `spt.pretrain.trainer.max_steps=4` for self-pretraining;
  every `-m` sweep gets `hydra.sweep.dir=multirun/<n>` so a later command can name it;
* `make demo` runs with `DEMO_ARGS` (20 steps); `python -m lra_bench.bench` / `approx` with `SHRINK_APP` (one
  short length, a few landmark counts); `make reproduce` with `REPRODUCE_ARGS` (the scratch data and folders, the
  run shrunk by `--override`s, so it is a real reproduction cycle of a trial), and `python -m
  lra_bench.reproductions` renders that scratch evidence into the scratch dir;
* `hydra/launcher=slurm` runs on the real single-node SLURM cluster of tests/slurm_cluster.py (`local_slurm`);
  where SLURM cannot be installed the same command runs with Hydra's basic launcher instead, and says so;
* placeholders (`<sweep dir>`, `<sweep>`, `<a gpa run>`, `<gpa search dir>`, `<the two final sweeps>`, …) are the
  dirs the earlier commands made.

`make test` is the one command not run: it is the command that runs this test (CI runs it).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lra_bench.record import results
from tests.conftest import REPO
from tests.test_tasks_image import write_cifar_pickles
from tests.test_tasks_text import write_aclimdb

pytestmark = pytest.mark.slow

README = REPO / "README.md"

SHRINK_RUN = [
    "model.dim=16",
    "model.ffn_dim=32",
    "model.head_dim=8",
    "model.head_hidden=16",
    "data.batch_size=8",
    "trainer.max_steps=4",
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
    "optim.warmup_steps=1",
    "diagnostics.enabled=false",
    "callbacks.progress_bar=none",
    "callbacks.stats_warmup_steps=1",
    "logger=csv",
    "print_config=false",
]
SHORT = ["task.max_length=64", "task.seq_len=64"]  # the same keys for ListOps and Text: a sweep over both takes them
SHRINK_TASK = {"listops": SHORT, "text": SHORT, "image": ["data.batch_size=4"]}
SHRINK_APP = {
    "lra_bench.bench": [
        "seq_lens=[64]",
        "landmarks=[8]",
        "batch_size=1",
        "modes=[forward]",
        "warmup=0",
        "repeats=1",
        "min_repeats=1",
        "isolate=false",
        "count_flops=false",
        "plots=false",
        "profile.enabled=false",
    ],
    "lra_bench.approx": ["n=64", "seeds=[0]", "landmarks=[4,8]", "model.enabled=false", "plots=false", "threads=1"],
}
DEMO_ARGS = "trainer.max_steps=20 trainer.val_check_interval=10 diagnostics.max_len=32"


def readme_commands() -> list[str]:
    """The commands of every ```bash block, in order (comment lines and trailing `# …` comments dropped)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for line in block.splitlines():
            command = re.split(r"\s+#", line, maxsplit=1)[0].strip()
            if command and not command.startswith("#"):
                out.append(command)
    return out


def task_of(args: list[str]) -> str:
    for arg in args:
        if arg.startswith("task="):
            return arg.split("=", 1)[1].split(",")[0]
        if arg.startswith("experiment=spt/"):
            return arg.split("/", 1)[1]
    return "listops"


class Scratch:
    """The dir the README's commands run in, and what they made (for the placeholders)."""

    def __init__(self, root: Path, slurm: object | None) -> None:
        self.root, self.slurm = root, slurm
        self.evidence = root / "reproductions"
        self.sweeps: list[tuple[Path, list[str]]] = []  # (sweep dir, the command's arguments)
        self.searches: dict[str, Path] = {}
        self.finals: list[Path] = []
        write_aclimdb(root / "data")
        write_cifar_pickles(root / "data")
        from tasks.generate import listops

        listops.write_splits(  # official-format files (no generator marker): used as they are by every run
            root / "data" / "listops-1000", 96, 24, 24, progress=False, workers=1,
            min_length=8, max_length=64, max_depth=4, max_args=4, seed=0,
        )  # fmt: skip

    def env(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
        env["WANDB_DIR"] = str(self.root / "wandb-dir")
        if self.slurm is not None:
            from tests import conftest_slurm

            env.update(conftest_slurm.job_env(self.slurm, self.root))  # type: ignore[arg-type]
        return env

    def placeholders(self, command: str) -> str:
        def run_dir(attn: str) -> str:
            sweep = self.sweep_with(attn=("gpa", "nystrom"))
            (hit,) = [
                p.parent for p in sweep.glob(f"*/{results.FILENAME}") if (r := results.read_record(p))["attn"] == attn
                and r["seed"] == 0
            ]  # fmt: skip
            return str(hit)

        table = {
            "multirun/<sweep dir>": lambda: str(self.sweep_with(selector=("uniform", "segment_means"))),
            "multirun/<sweep>/<a gpa run>": lambda: run_dir("gpa"),
            "multirun/<sweep>/<a nystrom run>": lambda: run_dir("nystrom"),
            "multirun/<sweep>": lambda: str(self.sweep_with(attn=("gpa", "nystrom"))),
            "<gpa search dir>": lambda: str(self.searches["gpa"]),
            "<nystrom search dir>": lambda: str(self.searches["nystrom"]),
            "<the two final sweeps>": lambda: " ".join(str(p) for p in self.finals),
        }
        for key, value in table.items():
            if key in command:
                command = command.replace(key, value())
        assert "<" not in command, f"a README placeholder this test does not know: {command}"
        return command

    def sweep_with(self, **swept: tuple[str, ...]) -> Path:
        """The latest sweep whose command swept each key over (at least) the given values, e.g. `attn=("gpa",
        "nystrom")` — read from the command, since long job dir names are cut (`…+diagnost-<hash>`)."""
        for sweep, args in reversed(self.sweeps):
            values = {a.split("=", 1)[0]: a.split("=", 1)[1].split(",") for a in args if "=" in a}
            if all(set(wanted) <= set(values.get(key, [])) for key, wanted in swept.items()):
                return sweep
        raise AssertionError(f"no earlier README sweep over {swept}")

    def argv(self, command: str) -> tuple[list[str], str]:
        """The command as run here, and a note saying how it was changed (shrunk, launcher)."""
        words = shlex.split(self.placeholders(command))
        note = ""
        if words[:2] == ["make", "demo"]:
            extra = f"{DEMO_ARGS} output_root={self.root / 'outputs'} data_dir={self.root / 'data'}"
            return ["make", "-C", str(REPO), "demo", f"DEMO_ARGS={extra}"], "shrunk"
        if words[:2] == ["make", "reproduce"]:
            shrink = [*SHRINK_RUN, *SHORT]
            where = f"--data-dir {self.root / 'data'} --evidence-root {self.evidence} --work-root {self.root / 'work'}"
            extra = where + "".join(f" --override={o}" for o in shrink)
            return ["make", "-C", str(REPO), *words[1:], f"REPRODUCE_ARGS={extra}"], "shrunk"
        assert words[0] == "python", command
        if words[1] == "-m":
            module, args = words[2], words[3:]
            extra = SHRINK_APP.get(module, [])
            if module == "lra_bench.reproductions":  # the scratch evidence, into the scratch dir
                extra = ["--root", str(self.evidence), "--out", str(self.root / "docs" / "reproductions.md")]
            if module == "lra_bench.reproduce_sweep":  # make reproduce's folders and shrink, for every job
                return self.reproduce_sweep(args)
            if module in ("lra_bench.bench", "lra_bench.approx"):
                extra = [*extra, f"hydra.run.dir={self.root / module.split('.')[-1]}"]
            return [sys.executable, "-m", module, *args, *extra], "shrunk" if extra else ""
        assert words[1] == "run.py", command
        args = words[2:]
        if any(a.startswith(("--cfg", "--info", "--help")) for a in args):
            return [sys.executable, str(REPO / "run.py"), *args], ""
        task = task_of(args)
        extra = [*SHRINK_RUN, *SHRINK_TASK.get(task, [])]
        if task == "text" and any(a == "protocol=skyformer" for a in args):
            extra += ["task.max_length=64", "task.seq_len=64"]
        if any(a.startswith("experiment=spt/") or a == "stage=pretrain" for a in args):
            extra += ["spt.pretrain.trainer.max_steps=4"]
        if any(a.startswith("hparams_search=") for a in args):
            extra += ["tuning.budget=2"]
        if "-m" in args or any(a.startswith("hparams_search=") for a in args):
            sweep = self.root / "multirun" / str(len(self.sweeps))
            extra.append(f"hydra.sweep.dir={sweep}")
        launcher, note = self.launcher(args)
        extra += launcher
        return [sys.executable, str(REPO / "run.py"), *args, *extra], note or "shrunk"

    def launcher(self, args: list[str]) -> tuple[list[str], str]:
        """`hydra/launcher=slurm` on the test cluster (one CPU a job), or Hydra's basic launcher where there is none."""
        if "hydra/launcher=slurm" not in args:
            return [], ""
        if self.slurm is None:
            args.remove("hydra/launcher=slurm")
            return [], "SLURM unavailable here: Hydra's basic launcher instead"
        return ["hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=null"], ""

    def reproduce_sweep(self, args: list[str]) -> tuple[list[str], str]:
        """The table's one command with `make reproduce`'s scratch folders and shrink (its Hydra arguments after --)."""
        split = args.index("--") if "--" in args else len(args)
        ours, hydra = args[:split], args[split + 1 :]
        launcher, note = self.launcher(hydra)
        where = ["--data-dir", str(self.root / "data"), "--evidence-root", str(self.evidence)]
        where += ["--work-root", str(self.root / "work"), "--page", str(self.root / "docs" / "reproductions.md")]
        hydra += [*SHRINK_RUN, *SHORT, *launcher, "hydra.callbacks.leaderboard.plots=false"]
        return [sys.executable, "-m", "lra_bench.reproduce_sweep", *ours, *where, "--", *hydra], note or "shrunk"

    def after(self, argv: list[str]) -> None:
        """Remember the sweep / search dir a command made."""
        sweep = next((a.split("=", 1)[1] for a in argv if a.startswith("hydra.sweep.dir=")), None)
        if sweep is None:
            return
        path = Path(sweep)
        if any(a.startswith("hparams_search=") for a in argv):
            attn = next(a.split("=", 1)[1] for a in argv if a.startswith("attn="))
            self.searches[attn] = path
        elif any(a == "tuning=tuned" for a in argv):
            self.finals.append(path)
        self.sweeps.append((path, argv))


@pytest.fixture
def slurm(request: pytest.FixtureRequest) -> object | None:
    """The session's local SLURM cluster, or None where SLURM cannot be installed (then a basic launcher)."""
    try:
        return request.getfixturevalue("local_slurm")
    except pytest.skip.Exception:
        return None


def test_the_readme_command_blocks_are_found() -> None:
    commands = readme_commands()
    first_screen = [
        "make demo",
        "make test",
        "python run.py experiment=smoke attn=nystrom",
        "python run.py experiment=cpu_small attn=nystrom",
        "python -m lra_bench.runs",
    ]
    assert commands[:5] == first_screen, "the README's first screen shows exactly these: set-up, presets, runs"
    assert any(c.startswith("python run.py task=listops attn=gpa") for c in commands)
    assert len(commands) > 20


@pytest.mark.timeout(3000)
def test_every_readme_command_runs_as_written(tmp_path: Path, slurm: object | None) -> None:
    scratch = Scratch(tmp_path, slurm)
    ran = []
    for command in readme_commands():
        if command == "make test":
            continue  # the command that runs this very test
        argv, note = scratch.argv(command)
        started = time.monotonic()
        proc = subprocess.run(argv, cwd=tmp_path, env=scratch.env(), capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, (
            f"README command failed ({proc.returncode}): {command}\n  as run: {shlex.join(argv)}\n"
            f"STDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-4000:]}"
        )
        scratch.after(argv)
        ran.append((command, ", ".join([*filter(None, [note]), f"{time.monotonic() - started:.1f} s"])))
    print("\n".join(f"{c}  [{n}]" for c, n in ran))  # with -s: what ran, how it was changed, how long it took
    assert len(ran) == len(readme_commands()) - 1
