"""Bad input → one line naming the key (or file), the value and what is valid; exit 2; nothing written.

The pre-flight (`lra_bench.preflight.command_line`) is called in-process for the many config cases (fast) and through
real `run.py` / `python -m lra_bench.bench` / `python -m lra_bench.leaderboard` processes for a representative few.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lra_bench.bench.checks import check_bench
from lra_bench.preflight.command_line import preflight
from lra_bench.run.build import check_run_config
from tasks.layout import DataSourceError
from tests.conftest import REPO, TINY_LISTOPS, compose

SEQ_LENS = {"listops": 2048, "text": 4096, "retrieval": 4096, "image": 1024, "pathfinder": 1024, "pathx": 16384}


def _refused(capsys: pytest.CaptureFixture, argv: list[str], **kwargs) -> str:
    """Run the pre-flight on `argv`; it must exit 2 with exactly one `error:` line on stderr (returned)."""
    with pytest.raises(SystemExit) as exit_:
        preflight(argv, **kwargs)
    assert exit_.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, Path]:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes(b"PK\x03\x04 cut short")
    return {"file": a_file, "corrupt": corrupt, "out": tmp_path / "out"}


CASES = [
    (["optim.lr=abc"], "optim.lr='abc': expected a number > 0"),
    (["optim.lr=0"], "optim.lr=0: expected a number > 0"),
    (["optim.lr=-1e-3"], "optim.lr=-0.001: expected a number > 0"),
    (["trainer.val_check_interval=0"], "trainer.val_check_interval=0: expected an integer >= 1 or a number > 0"),
    (["seed=-1"], "seed=-1: expected an integer in [0, 4294967295]"),
    (["data.batch_size=abc"], "data.batch_size='abc': expected an integer >= 1"),
    (["model.dropout=1.5"], "model.dropout=1.5: expected a number >= 0 and < 1"),
    (["attn=local", "attn.window=0"], "attn.window=0: expected an integer >= 1"),
    (["task=pathfinder", "task.difficulty=99"], "task=pathfinder: task.difficulty='99': expected one of baseline"),
    (["task=image", "task.val_fraction=0"], "task.val_fraction=0.0: expected a number > 0 and < 1"),
    (["task=text", "task.holdout_fraction=1.5"], "task.holdout_fraction=1.5: expected a number > 0 and < 1"),
    (["attn=zzz"], "Could not find 'attn/zzz' Available options in 'attn': full gpa"),  # no near miss: Hydra's
    (["trainer.detect_anomaly=true"], "use +trainer.detect_anomaly=true"),  # a pl.Trainer argument: Hydra's advice
    (["optim.lr=["], "no viable alternative at input '['"),
    (["attn=nystrom", "selector=kmeans,uniform"], "Ambiguous value for argument 'selector=kmeans,uniform'"),
]


#: a near miss is named first, whole (Hydra's advice to add `+` used to come first, the near miss only after it)
NEAR_MISSES = [
    (
        ["attn=nystorm"],
        "attn=nystorm: attn has no option nystorm; did you mean attn=nystrom? (options: full, gpa, linformer, local, "
        "nystrom, performer, pivoted, polynomial, skyformer, spectral, wildcat)",
    ),
    (
        ["experiment=smoke", "trainer.max_step=5"],
        "trainer.max_step=5: max_step is neither a key of trainer nor an argument of pl.Trainer; did you mean "
        "max_steps?",
    ),
    (["experiment=smok"], "experiment=smok: experiment has no option smok; did you mean experiment=smoke?"),
    (["hydra/launcher=slurmm"], "hydra/launcher=slurmm: hydra/launcher has no option slurmm; did you mean"),
    (["atn=full"], "atn=full: no key or config group atn; did you mean attn?"),
    (["trainr.max_steps=3"], "trainr.max_steps=3: no key or config group trainr; did you mean trainer?"),
    (["model.dimm=32"], "model.dimm=32: model has no key dimm; did you mean dim?"),
    (["data.foo=1"], "data.foo=1: data has no key foo (it has: batch_size, eval_batch_size, num_workers)"),
]


@pytest.mark.parametrize(("argv", "message"), NEAR_MISSES, ids=[" ".join(a) for a, _ in NEAR_MISSES])
def test_a_near_miss_is_the_one_line(capsys, paths, argv: list[str], message: str) -> None:
    line = _refused(capsys, [*argv, f"output_root={paths['out']}"], check=check_run_config)
    assert line.startswith(f"error: {message}"), line
    assert "+" not in line.split(";")[0] and "To append" not in line
    assert not paths["out"].exists()


@pytest.mark.parametrize(("argv", "message"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_config_mistakes_are_one_line_exit_2(capsys, paths, argv: list[str], message: str) -> None:
    line = _refused(capsys, [*argv, f"output_root={paths['out']}"], check=check_run_config)
    assert message in line
    assert not paths["out"].exists()  # nothing written


#: a bad value for every rule of `lra_bench.config.validate.RULES` (the completeness test below keeps it whole)
BAD_VALUES = {
    "seed": "-1",
    "threads": "0",
    "train": "maybe",
    "test": "maybe",
    "print_config": "maybe",
    "model.dim": "0",
    "model.depth": "0",
    "model.num_heads": "0",
    "model.head_dim": "0",
    "model.ffn_dim": "0",
    "model.head_hidden": "0",
    "model.dropout": "1.0",
    "optim.lr": "0",
    "optim.weight_decay": "-0.1",
    "optim.betas": "[0.9]",
    "optim.eps": "0",
    "optim.warmup_steps": "-1",
    "optim.grad_clip_val": "0",
    "optim.grad_clip_algorithm": "clip",
    "data.batch_size": "0",
    "data.eval_batch_size": "0",
    "data.num_workers": "-1",
    "trainer.max_steps": "0",
    "trainer.val_check_interval": "1.5",
    "trainer.limit_val_batches": "0",
    "trainer.limit_test_batches": "-1",
    "trainer.log_every_n_steps": "0",
    "trainer.accumulate_grad_batches": "0",
    "trainer.num_sanity_val_steps": "-2",
    "trainer.num_nodes": "0",
    "trainer.deterministic": "sometimes",
    "diagnostics.enabled": "maybe",
    "diagnostics.every_n_validations": "0",
    "diagnostics.max_len": "0",
    "diagnostics.probe_size": "0",
    "diagnostics.rank_tol": "0",
    "diagnostics.heads": "[-1]",
    "diagnostics.layers": "[0.5]",
    "callbacks.checkpoint_every_n_steps": "0",
    "callbacks.stats_warmup_steps": "-1",
    "callbacks.progress_bar": "sometimes",
    "callbacks.status_every_s": "0",
    "task.max_length": "0",
    "task.seq_len": "0",
    "attn.window": "0",
}
#: what a rule's key needs composed before it exists (a component's own knob)
CONTEXT = {"attn.window": ["attn=local"]}


def test_every_validation_rule_has_a_bad_value_here() -> None:
    from lra_bench.config.validate import RULES

    assert set(BAD_VALUES) == set(RULES)


@pytest.mark.parametrize("key", sorted(BAD_VALUES))
def test_every_validation_rule_refuses_a_bad_value_in_one_line(capsys, paths, key: str) -> None:
    from lra_bench.config.validate import RULES

    overrides = [*CONTEXT.get(key, []), f"{key}={BAD_VALUES[key]}", f"output_root={paths['out']}"]
    line = _refused(capsys, overrides, check=check_run_config)
    assert line.startswith(f"error: {key}=") and line.endswith(f": expected {RULES[key].valid}"), line
    assert not paths["out"].exists()


ADDED_KEYS = [
    (
        ["+trainer.max_step=5"],  # what Hydra itself suggests for `trainer.max_step=5`
        "+trainer.max_step=5: max_step is neither a key of trainer nor an argument of pl.Trainer; did you mean "
        "max_steps?",
    ),
    (["-m", "+trainer.max_step=1,2"], "+trainer.max_step=1,2: max_step is neither a key of trainer"),
    (["+model.dimm=32"], "+model.dimm=32: model has no key dimm; did you mean dim?"),
    (["++optim.lrr=0.1"], "++optim.lrr=0.1: optim has no key lrr; did you mean lr?"),
    (["+callbacks.stats_warmup_step=3"], "callbacks has no key stats_warmup_step; did you mean stats_warmup_steps?"),
    (["+spt.pretrain.optim.schedul=constant"], "optim has no key schedul; did you mean schedule?"),
    (["+data.foo=1"], "+data.foo=1: data has no key foo (it has: batch_size, eval_batch_size, num_workers)"),
]


@pytest.mark.parametrize(("argv", "message"), ADDED_KEYS, ids=[" ".join(a) for a, _ in ADDED_KEYS])
def test_unknown_added_keys_are_one_line_exit_2(capsys, paths, argv: list[str], message: str) -> None:
    line = _refused(capsys, [*argv, f"output_root={paths['out']}"], check=check_run_config)
    assert message in line
    assert not paths["out"].exists()


LEGITIMATE_ADDS = [
    ["+trainer.detect_anomaly=true"],  # a pl.Trainer argument the trainer: group does not list
    ["+trainer.max_time={seconds:4}"],
    ["+spt.pretrain.optim.schedule=constant"],  # the pretraining stage's own value of optim.schedule
    [
        "+callbacks.lr_monitor._target_=pytorch_lightning.callbacks.LearningRateMonitor",
        "+callbacks.lr_monitor.logging_interval=step",
    ],
    ["+notes.owner=me"],  # a new top-level key
    ["+hydra.job.env_set.LRA_TEST=1"],  # Hydra's own config
    ["++trainer.max_steps=3"],  # `++` of a key that exists: an override
]


@pytest.mark.parametrize("argv", LEGITIMATE_ADDS, ids=[" ".join(a) for a in LEGITIMATE_ADDS])
def test_legitimate_added_keys_pass_the_preflight(capsys, paths, argv: list[str]) -> None:
    preflight([*argv, f"output_root={paths['out']}"], check=check_run_config)
    assert "error" not in capsys.readouterr().err


@pytest.mark.parametrize("task", sorted(SEQ_LENS))
def test_max_length_beyond_seq_len_is_one_line_for_every_task(capsys, paths, task: str) -> None:
    n = SEQ_LENS[task]
    line = _refused(
        capsys, [f"task={task}", f"task.max_length={n + 1}", f"output_root={paths['out']}"], check=check_run_config
    )
    assert f"task.max_length={n + 1} exceeds task.seq_len={n}" in line


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("data_dir", "data_dir={file}: not a directory"),
        ("cache_dir", "cache_dir={file}: not a directory"),
        ("output_root", "output_root={file}: not a directory"),
        ("ckpt_path", "ckpt_path={corrupt}: not a usable checkpoint (not a torch.save zip archive"),
    ],
)
def test_bad_paths_are_one_line_exit_2(capsys, paths, key: str, message: str) -> None:
    value = paths["corrupt"] if key == "ckpt_path" else paths["file"]
    out = [] if key == "output_root" else [f"output_root={paths['out']}"]
    line = _refused(capsys, [f"{key}={value}", *out], check=check_run_config)
    assert message.format(**paths) in line


def test_an_existing_run_dir_that_is_not_writable(capsys, tmp_path: Path) -> None:
    run_dir = tmp_path / "out" / "listops" / "gpa" / "default"
    run_dir.mkdir(parents=True)
    if os.geteuid() == 0:  # root writes through modes: a read-only mount is what stops it
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=16k", "tmpfs", str(run_dir)], capture_output=True
        )
        if mounted.returncode != 0:
            pytest.skip(f"as root, only a read-only mount makes a dir unwritable, and mount failed: {mounted.stderr!r}")
    else:
        run_dir.chmod(0o555)
    try:
        line = _refused(capsys, [f"output_root={tmp_path / 'out'}"])
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(run_dir)], check=False)
        else:
            run_dir.chmod(0o755)
    assert f"output dir {run_dir} is not writable" in line


def test_bench_settings_are_one_line_exit_2(capsys, tmp_path: Path) -> None:
    for argv, message in [
        (["seq_lens=[0]"], "seq_lens=[0]: expected a non-empty list of sequence lengths >= 1"),
        (["seq_lens=[1024,-8]"], "seq_lens=[1024, -8]: expected a non-empty list"),
        (["batch_size=-2"], "batch_size=-2: expected an integer >= 1"),
        (["landmarks=[0]"], "landmarks=[0]: expected a list of landmark counts >= 1 or 'log2'"),
    ]:
        line = _refused(capsys, [*argv, f"hydra.run.dir={tmp_path / 'b'}"], config_name="bench", check=check_bench)
        assert message in line
    assert not (tmp_path / "b").exists()


def test_leaderboard_of_an_empty_dir_is_one_line_exit_2(capsys, tmp_path: Path) -> None:
    from lra_bench.leaderboard.build import main

    for argv, message in [([str(tmp_path)], "no results.json under"), ([str(tmp_path / "nope")], "no such directory")]:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and err[0].startswith(f"error: {message}"), err
    assert not list(tmp_path.iterdir())  # no empty leaderboard files written


# -- data files -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"Source\tTarget\r\n( [MAX 2 \xff 3 ] )\t3\r\n", "not UTF-8 text (invalid start byte at byte"),
        (b"Source\tTarget\r\n", "no examples after the header"),
    ],
    ids=["non-utf8", "header-only"],
)
def test_bad_tsv_is_one_line_naming_the_file(tmp_path: Path, content: bytes, message: str) -> None:
    from lra_bench.run.entry import run_stage
    from tasks.generate import listops as generator

    folder = tmp_path / "data" / "listops-1000"
    generator.write_splits(folder, 16, 8, 8, progress=False, max_depth=3, min_length=8, max_length=64)
    (folder / "basic_val.tsv").write_bytes(content)
    cfg = compose([*TINY_LISTOPS, "attn=full", f"data_dir={tmp_path / 'data'}", "task.generate_if_missing=false"])
    with pytest.raises(DataSourceError) as err:
        run_stage(cfg, tmp_path / "run")
    assert str(err.value).startswith(f"{folder / 'basic_val.tsv'}: ") and message in str(err.value)
    assert "\n" not in str(err.value)


# -- the real command lines -----------------------------------------------------------------------------------------
def _cli(*argv: str, module: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, *(["-m", module] if module else [str(REPO / "run.py")]), *argv]
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_command_lines_refuse_with_one_line_and_write_nothing(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    out = tmp_path / "out"
    cases = [
        ([f"output_root={out}", "attn=zzz"], None, "Could not find 'attn/zzz'"),
        ([f"output_root={out}", "optim.lr=abc"], None, "optim.lr='abc'"),
        ([f"output_root={out}", "trainer.val_check_interval=0"], None, "trainer.val_check_interval=0"),
        ([f"output_root={out}", f"data_dir={tmp_path / 'data'}", "+trainer.max_step=5"], None, "max_steps?"),
        ([f"output_root={a_file}"], None, f"output_root={a_file}: not a directory"),
        ([f"hydra.run.dir={out}/b", "seq_lens=[0]"], "lra_bench.bench", "seq_lens=[0]"),
        ([str(tmp_path / "empty")], "lra_bench.leaderboard", "no such directory"),
    ]
    for argv, module, message in cases:
        proc = _cli(*argv, module=module)
        err = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(err) == 1 and message in err[0], (
            argv,
            proc.returncode,
            proc.stderr[-2000:],
        )
    assert not out.exists()
    assert not (tmp_path / "data").exists()  # refused before any data was generated


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["attn=nystorm"], "error: attn=nystorm: attn has no option nystorm; did you mean attn=nystrom?"),
        (["experiment=smoke", "trainer.max_step=5"], "error: trainer.max_step=5: max_step is neither a key of trainer"),
        (["-m", "attn=nystorm,gpa"], "error: sweep job attn=nystorm: attn=nystorm: attn has no option nystorm; did"),
    ],
    ids=["option", "key", "sweep"],
)
def test_run_py_names_the_near_miss_in_its_one_line(tmp_path: Path, argv: list[str], message: str) -> None:
    """The issue's commands, through real run.py processes: the near miss is the line, exit 2, nothing created."""
    proc = _cli(*argv, f"output_root={tmp_path / 'out'}", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(err) == 1 and err[0].startswith(message), (proc.returncode, proc.stderr)
    assert "did you mean" in err[0] and "To append" not in err[0]
    assert list(tmp_path.iterdir()) == []


# -- a mistyped data_dir ------------------------------------------------------------------------------------------
def _missing_parent_line(value: Path) -> str:
    return (
        f"error: data_dir={value}: {value.parent} does not exist; give data_dir= an existing folder or a new one "
        "inside an existing folder"
    )


@pytest.mark.parametrize("sweep", [[], ["--multirun", "seed=1,2"]], ids=["run", "multirun"])
def test_a_data_dir_in_a_missing_folder_is_refused_by_the_preflight(capsys, paths, sweep: list[str]) -> None:
    value = paths["out"].parent / "no" / "such" / "lra"
    line = _refused(capsys, [*sweep, f"data_dir={value}", f"output_root={paths['out']}"], check=check_run_config)
    assert line == _missing_parent_line(value)
    assert not (paths["out"].parent / "no").exists()


def test_a_new_data_dir_in_an_existing_folder_passes_the_preflight(capsys, paths) -> None:
    preflight([f"data_dir={paths['out'].parent / 'new-data'}", f"output_root={paths['out']}"], check=check_run_config)
    assert "error" not in capsys.readouterr().err


def test_run_py_refuses_a_data_dir_in_a_missing_folder_and_creates_nothing(tmp_path: Path) -> None:
    """It used to make the whole path, generate the preset's data there and train."""
    value = tmp_path / "no" / "such" / "parent" / "lra"
    short = ["trainer.max_steps=2", "trainer.val_check_interval=1"]  # (had it started, a short run)
    proc = _cli("experiment=smoke", f"data_dir={value}", f"output_root={tmp_path / 'out'}", *short)
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and err == [_missing_parent_line(value)], (proc.returncode, proc.stderr[-3000:])
    assert list(tmp_path.iterdir()) == []  # no data dir, no run dir
