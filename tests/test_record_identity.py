"""Record & identity without training: pasteable run dirs, the one record builder, off-protocol, leaderboard rows
keyed on experiments, and the per-example test outputs' ordering under a padding DistributedSampler.

Records here are made by the real builder from configs composed through the real tree (no hand-written
fields), so what the leaderboard sees is what a run writes. End-to-end checks with real runs: tests/test_record_e2e.py.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf, open_dict

from lra_bench.leaderboard import build_leaderboard
from lra_bench.leaderboard.sweep_callback import LeaderboardCallback
from lra_bench.record import results
from tests.conftest import compose, fault

# The modules this issue added are imported inside the tests, so each test fails on its own (not the whole file at
# collection) against code without them.
DATA = {"data.tokens": "0123456789abcdef"}


# -- item 7: every printed path pastes back as an override value, unquoted ------------------------------------------
@pytest.mark.parametrize(
    "overrides",
    [
        ["attn=nystrom", "attn.num_landmarks=8", "seed=1", "optim.lr=1e-3"],
        ["attn=gpa", *fault(step_sleep_s=0.4), "model.dim=16", "trainer.max_steps=-1"],
        ["experiment=demo", "attn=full", "data.eval_batch_size=null"],
        ["attn=full", "optim.betas=[0.9,0.98]", "+trainer.max_time={seconds:4}"],  # `,` `:` `{` in values
    ],
)
def test_run_dirs_paste_back_as_unquoted_override_values(tmp_path: Path, overrides: list[str]) -> None:
    from hydra.core.hydra_config import HydraConfig

    cfg = compose([*overrides, f"output_root={tmp_path}"], return_hydra_config=True)  # Hydra fills override_dirname
    HydraConfig.instance().set_config(cfg)
    try:
        run_dir = str(OmegaConf.to_container(cfg.hydra.run, resolve=True)["dir"])
        sweep_sub = str(OmegaConf.to_container(cfg.hydra.sweep, resolve=True)["subdir"])
    finally:
        HydraConfig.instance().cfg = None  # type: ignore[assignment]
    parser = OverridesParser.create()
    for path in (f"{run_dir}/checkpoints/last.ckpt", f"{tmp_path}/multirun/x/{sweep_sub}/checkpoints/best-4.ckpt"):
        (parsed,) = parser.parse_overrides([f"ckpt_path={path}"])  # Hydra's own grammar, as run.py parses it
        assert parsed.value() == path, (path, parsed.value())


# -- item 5: one record builder for the run and the sweep callback ------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "selector", "landmarks"),
    [(["attn=full"], None, None), (["attn=gpa"], "gpa", 11), (["attn=nystrom", "selector=kmeans"], "kmeans", 64)],
)
def test_sweep_callback_and_run_build_the_same_record_fields(
    tmp_path: Path, overrides: list[str], selector: str | None, landmarks: int | None
) -> None:
    cfg = compose(overrides, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(tmp_path)
    failed = JobReturn()
    failed.status, failed.return_value = JobStatus.FAILED, RuntimeError("worker died")
    LeaderboardCallback().on_job_end(cfg, failed)
    from_callback = results.read_record(tmp_path / results.FILENAME)
    assert (from_callback["selector"], from_callback["rank_budget"]) == (selector, landmarks)  # log2(2048) = 11
    from lra_bench.record.builder import new_record  # what train() builds its record with

    from_run = new_record(compose(overrides), tmp_path).to_dict()
    keys = ("task", "attn", "selector", "protocol", "rank_budget", "seed")
    assert {k: from_callback[k] for k in keys} == {k: from_run[k] for k in keys}


@pytest.mark.parametrize("task", ["listops", "text", "retrieval", "image", "pathfinder", "pathx"])
def test_record_config_and_identity_are_plain_json(task: str) -> None:
    """What goes into results.json, identity.json and every checkpoint (loaded with `weights_only=True`, which
    refuses any class, a str-valued Enum included): exactly plain types, and a task's own values compare equal to its
    protocol's (no spurious deviation)."""
    from lra_bench.config import conformance
    from lra_bench.config.validate import check_components

    cfg = compose([f"task={task}", "attn=full"])
    check_components(cfg)  # what validate() does first: typed schema values (enums) replace the YAML's
    record, identity = _identity_of(cfg)
    assert _plain(record["config"]) and _plain(identity)
    found = conformance.check(identity, task, record["protocol"], "full", None)
    assert found == {"off_protocol": False, "deviations": {}}


def _plain(value: Any) -> bool:
    if type(value) is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if type(value) is list:
        return all(_plain(v) for v in value)
    return type(value) in (str, int, float, bool, type(None))


def _identity_of(cfg: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The record and identity a run of `cfg` makes: settled as the run settles it (derived keys), then recorded."""
    from lra_bench.config.conformance import derive_run_keys
    from lra_bench.record.builder import new_record
    from lra_bench.record.identity import run_identity

    derive_run_keys(cfg)
    record = new_record(cfg, Path("/nonexistent/run"), with_env=False).to_dict()
    return record, run_identity(record["config"], DATA)


# -- item 5: off-protocol ---------------------------------------------------------------------------------------
def _identity(overrides: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    return _identity_of(compose(overrides))


def test_trainer_precision_is_part_of_the_fingerprint() -> None:
    """Two runs that differ only in `trainer.precision` (fp32 vs bf16 autocast: other numbers) are two
    experiments: the key is in the identity, the fingerprints differ, and it is the one key that differs."""
    from lra_bench.record.identity import differing_keys, fingerprint

    _, fp32 = _identity(["attn=nystrom", "trainer.precision=32-true"])
    _, bf16 = _identity(["attn=nystrom", "trainer.precision=bf16-mixed"])
    assert fp32["trainer.precision"] == "32-true" and bf16["trainer.precision"] == "bf16-mixed"
    assert fingerprint(fp32) != fingerprint(bf16)
    assert differing_keys([fp32, bf16]) == ["trainer.precision"]


@pytest.mark.parametrize(
    ("overrides", "changed"),
    [
        (["attn=nystrom"], {}),
        (["attn=gpa", "attn.num_landmarks=32", "selector=kmeans", "seed=3", "diagnostics.max_len=64"], {}),
        (["attn=nystrom", "attn.num_landmarks=32"], {"attn.num_landmarks": {"protocol": 64, "run": 32}}),
        (["attn=nystrom", "trainer.max_steps=4"], {"trainer.max_steps": {"protocol": 5000, "run": 4}}),
        (["attn=full", "trainer=gpu", "trainer.accelerator=cpu"], {"trainer.precision": None}),
        (["attn=full", "optim.lr=1e-3", "data_dir=/elsewhere", "logger=none"], {"optim.lr": None}),
    ],
)
def test_off_protocol_lists_exactly_the_changed_protocol_values(overrides: list[str], changed: dict) -> None:
    from lra_bench.config import conformance

    record, identity = _identity(overrides)
    found = conformance.check(identity, record["task"], record["protocol"], record["attn"], record["selector"])
    assert found["off_protocol"] is bool(changed)
    assert set(found["deviations"]) == set(changed)
    for key, values in changed.items():
        if values is not None:
            assert found["deviations"][key] == values


def test_debug_fdr_is_off_protocol() -> None:
    from lra_bench.config import conformance

    _, identity = _identity(["attn=gpa", "debug=fdr"])
    found = conformance.check(identity, "listops", "nystromformer", "gpa", "gpa")
    assert {"trainer.max_steps", "trainer.val_check_interval", "trainer.limit_val_batches"} <= set(found["deviations"])


# -- item 5: leaderboard rows are experiments --------------------------------------------------------------------
def _write(root: Path, name: str, overrides: list[str], test_acc: float, finished: str = "2026-01-02T00:00:00") -> Path:
    from lra_bench.config import conformance
    from lra_bench.record.identity import fingerprint

    record, identity = _identity(overrides)
    record.update(status="completed", identity=identity, fingerprint=fingerprint(identity))
    record.update(conformance.check(identity, record["task"], record["protocol"], record["attn"], record["selector"]))
    record["run"].update(output_dir=str(root / name), finished_at=finished)
    record["metrics"].update(test_acc=test_acc, val_acc=test_acc)
    results.write_atomic(root / name / results.FILENAME, record)
    return root / name


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_leaderboard_rows_are_one_fingerprint_except_seed(tmp_path: Path) -> None:
    proto = ["attn=nystrom"]  # the protocol itself: on-protocol
    _write(tmp_path, "p0", [*proto, "seed=0"], 0.40)
    _write(tmp_path, "p1", [*proto, "seed=1"], 0.42)
    _write(tmp_path, "p1-stale", [*proto, "seed=1"], 0.10, finished="2025-12-31T00:00:00")  # same fp and seed
    for steps, acc in ((4, 0.20), (20, 0.30)):  # a 4-step and a 20-step run are two experiments
        _write(tmp_path, f"s{steps}", [*proto, f"trainer.max_steps={steps}"], acc)
    for lr, acc in (("1e-3", 0.33), ("1e-2", 0.35)):  # an lr sweep: two rows
        _write(tmp_path, f"lr{lr}", [*proto, f"optim.lr={lr}", "trainer.max_steps=20"], acc)
    table = build_leaderboard([tmp_path], tmp_path / "board", plots=False)
    rows = table["rows"]
    assert len(rows) == 5, [(r["variant"], r["n"]) for r in rows]
    on = [r for r in rows if r["conformance"] == "on"]
    assert len(on) == 1 and on[0]["n"] == 2 and on[0]["seeds"] == "0,1"
    assert on[0]["test_acc_mean"] == pytest.approx(41.0)  # the stale seed-1 run was superseded, not pooled
    assert [Path(s["path"]).parent.name for s in table["superseded"]] == ["p1-stale"]
    off = {r["variant"]: r for r in rows if r["conformance"] == "off"}
    assert set(off) == {
        "optim.lr=0.0001, trainer.max_steps=4",
        "optim.lr=0.0001, trainer.max_steps=20",
        "optim.lr=0.001, trainer.max_steps=20",
        "optim.lr=0.01, trainer.max_steps=20",
    }
    assert all(r["off_protocol"] is True and "trainer.max_steps" in r["deviations"] for r in off.values())
    csv_rows = _csv(table["csv"])
    assert {r["off_protocol"] for r in csv_rows} == {"True", "False"}
    assert {r["fingerprint"] for r in csv_rows} == {r["fingerprint"] for r in rows} and len(csv_rows) == 5
    md = table["markdown"].read_text()
    beside = md.split("### protocol: nystromformer")[1].split("#### protocol: nystromformer — not comparable")[0]
    assert "published: Nyströmformer Table 3" in beside and "nystrom / segment_means (m=64) |" in beside
    assert "off-protocol" not in beside  # no off-protocol row beside the paper's numbers
    apart = md.split("#### protocol: nystromformer — not comparable")[1].split("\n## ")[0]  # that section only
    assert apart.count("⚠ off-protocol |") == 4 and "published:" not in apart
    wide = [r for r in _csv(table["wide_csv"]) if r["kind"] == "ours"]
    assert len(wide) == 5 and sum(r["off_protocol"] == "True" for r in wide) == 4


def test_seed_free_drops_only_what_follows_the_seed() -> None:
    from lra_bench.record.identity import fingerprint, seed_free

    _, identity = _identity(["attn=nystrom", "selector=kmeans", "seed=3"])
    assert identity["selector.seed"] == 3 and "seed" not in seed_free(identity)
    assert "selector.seed" not in seed_free(identity)
    _, pinned = _identity(["attn=nystrom", "selector=kmeans", "seed=3", "selector.seed=7"])
    assert seed_free(pinned)["selector.seed"] == 7  # a component seed set apart is another experiment
    _, other_seed = _identity(["attn=nystrom", "selector=kmeans", "seed=4"])
    assert fingerprint(seed_free(identity)) == fingerprint(seed_free(other_seed))
    assert fingerprint(identity) != fingerprint(other_seed)


# -- item 6: per-example outputs in split order under Lightning's padding DistributedSampler ------------------------
@pytest.mark.parametrize(("size", "world", "batch"), [(15, 2, 4), (16, 2, 4), (10, 3, 3), (7, 4, 2)])
def test_gathered_outputs_are_the_split_once_in_order(size: int, world: int, batch: int) -> None:
    """Each rank predicts what the real `DistributedSampler(shuffle=False)` gives it (padded with the split's first
    examples); the all-gather order is (position, rank). The result must be every example once, in order, with the
    prediction made for its original position — never a padding copy's."""
    from lra_bench.run.recorder import _in_split_order

    data = torch.utils.data.TensorDataset(torch.arange(size))
    per_rank = []
    for rank in range(world):
        sampler = torch.utils.data.DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False)
        loader = torch.utils.data.DataLoader(data, batch_size=batch, sampler=sampler)
        index = np.concatenate([np.asarray(b) for b in loader.batch_sampler])
        copy = np.arange(len(index)) * world + rank >= size  # position in the padded sequence past the split
        pred = np.where(copy, -99, 100 + index)  # a padding copy predicts garbage: it must never win
        per_rank.append(np.stack([index, index % 5, pred]))
    most = max(p.shape[1] for p in per_rank)
    stacked = np.stack([np.pad(p, ((0, 0), (0, most - p.shape[1])), constant_values=-1) for p in per_rank])
    rows = stacked.transpose(1, 2, 0).reshape(3, -1)  # what TestOutputs._gather builds from all_gather
    rows = rows[:, rows[0] >= 0]
    result, problem = _in_split_order(rows, np.zeros(rows.shape[1]), size)
    assert problem is None and result is not None
    assert result.examples == size and result.split_size == size
    assert result.pred.tolist() == list(range(100, 100 + size))
    assert result.label.tolist() == [i % 5 for i in range(size)]


def test_outputs_that_are_not_a_prefix_are_not_written() -> None:
    from lra_bench.run.recorder import _in_split_order

    rows = np.array([[0, 2, 3], [1, 1, 1], [1, 1, 1]])
    result, problem = _in_split_order(rows, np.zeros(3), 10)
    assert result is None and "not the split's first 3" in str(problem)


def test_one_identity_for_the_leaderboard_and_compare() -> None:
    """Records from before identities (here hand-written, without a config): the leaderboard puts two methods in
    two rows, and compare finds they differ only in the method — both through the one `identity_of` (two copies
    used to disagree: the leaderboard's stand-in had `record.*` keys, compare's had none, so compare saw two
    config-less methods as one experiment)."""
    import ast

    from lra_bench.compare.sides import METHOD_PREFIXES
    from lra_bench.leaderboard.experiments import group_fingerprint
    from lra_bench.record.identity import MEASUREMENT, differing_keys, identity_of

    base = {"task": "listops", "protocol": "nystromformer", "seed": 0, "rank_budget": None}
    a, b = {**base, "attn": "nystrom", "selector": "segment_means"}, {**base, "attn": "gpa", "selector": "gpa"}
    assert group_fingerprint(a) != group_fingerprint(b)
    assert differing_keys([identity_of(a), identity_of(b)]) == ["attn.name", "selector.name"]
    assert differing_keys([identity_of(a), identity_of(b)], ignore=(*METHOD_PREFIXES, *MEASUREMENT)) == []
    written = identity_of({**a, "identity": {"attn.name": "x"}})
    assert written == {"attn.name": "x", "model.kernels": "eager"}  # a written identity wins; its kernel baseline
    fused = identity_of({**a, "identity": {"attn.name": "x", "model.kernels": "fused"}})
    assert differing_keys([written, fused]) == ["model.kernels"]  # a reader labels the two paths by their values
    package = Path(__file__).resolve().parents[1] / "lra_bench"
    defined = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name == "identity_of"
    ]
    assert defined == ["record/identity.py"], defined
