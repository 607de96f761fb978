"""The config tree at start and the one-screen summary at the end (rich)."""

from __future__ import annotations

import io
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table
from rich.tree import Tree

from lra_bench import reproduction_runs
from lra_bench.kit.plain import plain_dict
from lra_bench.kit.terminal import table_console
from lra_bench.record.curves import FILENAME as CURVES
from lra_bench.record.identity import config_identity, seed_free
from lra_bench.record.provenance import hardware
from lra_bench.record.reader import typed
from lra_bench.reproduction_runs import REPO
from lra_bench.run.terminal import to_log_only

ORDER = ("task", "attn", "selector", "protocol", "model", "optim", "data", "trainer", "logger", "diagnostics")


def print_config(cfg: DictConfig, save_to: Path | None = None, terminal: bool = False) -> None:
    """The resolved config as a tree: into `save_to` and run.log always, on the terminal only with `terminal`
    (`print_config=true`): at ~100 lines it buried what a run says about itself."""
    tree = Tree("config", guide_style="dim")
    keys = [k for k in ORDER if k in cfg] + [k for k in cfg if k not in ORDER]
    for key in keys:
        value = cfg[key]
        text = OmegaConf.to_yaml(value, resolve=True) if isinstance(value, DictConfig) else str(value)
        tree.add(f"[bold]{key!s}[/]").add(text.rstrip())
    rendered = io.StringIO()
    Console(file=rendered, width=120).print(tree)
    if terminal:
        Console().print(tree)
    else:
        to_log_only(rendered.getvalue())
    if save_to is not None:
        save_to.write_text(rendered.getvalue())


def _fmt(value: Any, fmt: str = "{}") -> str:
    return "—" if value is None else fmt.format(value)


def changed_keys(record: dict[str, Any], shown: int = 6) -> str:
    """The first `shown` keys an off-protocol record changed, and how many more."""
    keys = list(record.get("deviations") or {})
    return ", ".join(keys[:shown]) + (f", … ({len(keys) - shown} more)" if len(keys) > shown else "")


#: the preset a faithful run's opening line offers for a quick look (README "Running" says what it costs)
QUICK_LOOK = "cpu_small"


def chosen_preset() -> str | None:
    """The `experiment=` preset this Hydra job was composed with; None without one (or outside Hydra)."""
    if not HydraConfig.initialized():
        return None
    choice = HydraConfig.get().runtime.choices.get("experiment")
    return None if choice in (None, "null") else str(choice)


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def measured_here(record: dict[str, Any]) -> str | None:
    """How long this run takes on this machine, as measured: the median wall time of the committed reproductions
    of the same experiment (seed aside) that completed on this CPU (`lra_bench.reproduction_runs`); None when
    there is none, so a duration is never guessed. Says what it is from (runs, their threads, their folder)."""
    here, experiment = hardware(), seed_free(config_identity(record["config"]))
    runs = reproduction_runs.completed_runs(str(record["protocol"]), str(record["task"]), str(record["attn"]))
    same = [
        r
        for r in runs
        if r.counted
        and r.machine == reproduction_runs.machine_of(here)
        and r.typed.env_part("hardware").get("gpus") == here["gpus"]
        and seed_free(config_identity(r.record["config"])) == experiment
    ]
    walls = sorted(w for r in same if (w := r.wall_s()) is not None)
    if not walls:
        return None
    threads = sorted({str(r.typed.env_part("runtime").get("threads", "?")) for r in same})
    folder = same[0].folder.parent.relative_to(REPO) if same[0].folder.is_relative_to(REPO) else same[0].folder.parent
    runs_here = f"{len(walls)} completed run{'s' if len(walls) > 1 else ''} of it here"
    return (
        f"about {_duration(statistics.median(walls))} on this CPU ({runs_here}, {'/'.join(threads)} thread"
        f"{'s' if threads != ['1'] else ''}: {folder})"
    )


def schedule_words(config: dict[str, Any]) -> str:
    """`5,000 steps of batch 32 at length 2,048, 62 val batches every 50 steps`: what the schedule asks of the
    machine, from the run's resolved config."""
    trainer = config["trainer"]
    steps, every, batches = trainer["max_steps"], trainer["val_check_interval"], trainer.get("limit_val_batches")
    evaluation = f"{batches} val batches" if isinstance(batches, int) else "a full validation"
    when = f"every {every} steps" if isinstance(every, int) else f"every {every} of an epoch"
    return (
        f"{steps:,} steps of batch {config['data']['batch_size']} at length {config['task']['seq_len']:,}, "
        f"{evaluation} {when}"
    )


def opening_line(record: dict[str, Any], preset: str | None = None) -> str:
    """One line before a run prepares its data: what it is. On protocol: the faithful schedule, how long it takes
    here when that was measured (`measured_here`), and the preset for a quick look; a preset (`experiment=`) off
    its protocol: that it is one, never ranked beside published rows (its deviations stay in the record); any
    other run off protocol: the keys it changes."""
    protocol = record.get("protocol")
    if record.get("off_protocol") is None:
        return f"[lra-bench] protocol {protocol}: not checked (its config for this task and attention does not compose)"
    if record["off_protocol"] and preset is not None:
        n = len(record.get("deviations") or {})
        return (
            f"[lra-bench] preset {preset}: not the {protocol} protocol, so never ranked beside published rows; "
            f"results.json lists the {n} setting{'s' if n != 1 else ''} it changes"
        )
    if record["off_protocol"]:
        return f"[lra-bench] OFF protocol {protocol}: changes {changed_keys(record)} (never ranked beside its rows)"
    duration = measured_here(record) or "no run of it recorded on this CPU; it projects its time after a validation"
    return (
        f"[lra-bench] on protocol {protocol} (faithful): {schedule_words(record['config'])} — {duration}. "
        f"Quick look on a small generated ListOps: python run.py experiment={QUICK_LOOK} attn={record['attn']}"
    )


def print_summary(record: dict[str, Any]) -> None:
    read = typed(record)
    m, run_dir = read.metrics, str(read.run.output_dir)
    title = f"{read.task} · {read.attn}" + (f" · {read.selector}" if read.selector else "")
    table = Table(title=f"lra-bench — {title} — {read.status}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    evaluation = read.evaluation
    test = [
        ("test loss", _fmt(m.test_loss, "{:.4f}") + f"  over {_fmt(m.test_examples)} examples"),
        ("majority class (val)", _fmt(read.data.get("majority_share"), "{:.4f}")),
    ]
    training = [
        ("training steps", _fmt(m.train_steps)),
        ("median step time", _fmt(m.step_time_median_s and m.step_time_median_s * 1000, "{:.1f} ms")),
        ("tokens / s", _fmt(m.tokens_per_s, "{:,.0f}")),
        ("data loading share", _fmt(m.data_share and 100 * m.data_share, "{:.1f} %")),
        ("peak memory", _fmt(m.peak_memory_mib, "{:,.0f} MiB") + f"  ({m.extra.get('peak_memory_kind', '')})"),
    ]
    tail = [("parameters", _fmt(m.params, "{:,}")), ("fingerprint", _fmt(read.fingerprint))]
    if read.off_protocol:
        tail.append(("off-protocol", f"changes {read.protocol}'s {changed_keys(record)}"))
    if evaluation:  # a tested checkpoint: its step instead of training numbers (its path is printed below)
        head = [
            ("checkpoint step", _fmt(evaluation.get("checkpoint_step"))),
            ("test accuracy", _fmt(m.test_acc, "{:.4f}")),
        ]
        training = []
    else:
        head = [
            ("val accuracy (best)", _fmt(m.val_acc, "{:.4f}") + f"  at step {_fmt(m.best_step)}"),
            ("test accuracy (best-val ckpt)", _fmt(m.test_acc, "{:.4f}")),
        ]
    rows = [*head, *test, *training, *tail]
    if read.error:
        rows.append(("error", str(read.error)))
    for key, value in rows:
        table.add_row(key, value)
    console = table_console(min_width=100)
    console.print(table)
    # paths on their own lines, never truncated, so they can be copied
    if evaluation:
        console.print(f"checkpoint:    {evaluation['checkpoint']}", soft_wrap=True)
    console.print(f"outputs:       {run_dir}", soft_wrap=True)
    console.print(f"result record: {Path(run_dir) / 'results.json'}", soft_wrap=True)
    curves = Path(run_dir) / CURVES
    if curves.exists():
        console.print(f"curves:        {curves}", soft_wrap=True)
    if sync := wandb_sync_command(record):
        console.print(f"W&B offline:   {sync}    # uploads this run's W&B log", soft_wrap=True, highlight=False)
    for line in next_commands(record):
        console.print(line, soft_wrap=True, highlight=False)


def wandb_sync_command(record: dict[str, Any]) -> str | None:
    """The command that uploads the run's offline W&B log, or None when there is none to upload.

    W&B names a folder it writes offline `offline-run-<time>-<id>` (online: `run-…`), so the folders themselves say
    the logger ran offline, for this attempt and every earlier one of a resumed run (each writes a part with the
    run's id); `wandb sync` leaves `run-<id>.wandb.synced` in a part it uploaded. One part: `wandb sync <part>`; the
    parts of a resumed run in start order with their shared id, which wandb needs to join them into one run (README,
    "W&B offline, resumed runs")."""
    run = typed(record).run
    if not run.wandb_id:
        return None
    folders = (Path(str(run.output_dir)) / "wandb").glob(f"offline-run-*-{run.wandb_id}")
    parts = sorted(p for p in folders if p.is_dir() and not any(p.glob("*.wandb.synced")))
    if len(parts) <= 1:
        return f"wandb sync {parts[0]}" if parts else None
    return f"wandb sync --id {run.wandb_id} {' '.join(map(str, parts))}"


def resume_command(cfg: DictConfig, output_dir: Path) -> str:
    """The command that continues this run from its checkpoints in `output_dir`.

    The command line as typed, when typing it again lands here and resumes: a single run (not a sweep's job) with
    `ckpt_path=last` and a folder name the command fixes. Otherwise (a sweep's job; a `run_name` drawn from the clock,
    as `experiment=demo`'s; another `ckpt_path`) this job's overrides with `hydra.run.dir=` this folder, where the
    default `ckpt_path=last` resumes. The program is `run.py` as typed, or the repository's own where this process
    was not started as it (a SLURM job's is submitit's `_submit.py`)."""
    program = sys.argv[0] if Path(sys.argv[0]).name == "run.py" else str(REPO / "run.py")
    if not HydraConfig.initialized():
        return shlex.join(["python", program, *sys.argv[1:]])
    hydra = HydraConfig.get()
    fixed_name = "${" not in str(plain_dict(cfg, resolve=False).get("run_name"))
    if hydra.mode == RunMode.RUN and str(cfg.get("ckpt_path")) == "last" and fixed_name:
        return shlex.join(["python", program, *sys.argv[1:]])
    overrides = [str(o) for o in hydra.overrides.task if not str(o).startswith(("ckpt_path=", "run_name="))]
    return shlex.join(["python", program, *overrides, f"hydra.run.dir={output_dir}"])


def next_commands(record: dict[str, Any]) -> list[str]:
    """What to type next, as the summary's last lines: resume a stopped run, list the runs, compare this one."""
    read = typed(record)
    run_dir = str(read.run.output_dir)
    root = str(read.config_at("output_root") or "")
    if not root or not Path(run_dir).resolve().is_relative_to(Path(root).resolve()):
        root = str(Path(run_dir).parent)  # a sweep's job: its sweep dir
    status = record["status"]
    if status == "interrupted":
        return ["next:          the same command resumes from checkpoints/last.ckpt"]
    if status == "failed":
        return [f"next:          the error in full: {Path(run_dir) / 'run.log'}"]
    return [
        f"next:          python -m lra_bench.runs {root}    # every run there, with its accuracy",
        f"               python -m lra_bench.compare {run_dir} <another run dir>    # does this one beat it?",
    ]
