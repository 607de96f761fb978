"""What the leaderboard may compare: ranks, the Pareto reference, one row per experiment, and "reproduced".

Every record here is made the way a run makes it: composed through the real config tree, its stage resolved, built by
the one record builder and identified (identity, fingerprint, protocol deviations) by the run's own `identify`; only
the numbers a run would measure are filled in by hand. The leaderboard is then built by the CLI's entry function
(`python -m lra_bench.leaderboard DIR --out OUT`), and the tests read the files it wrote.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from scipy import stats

from lra_bench.leaderboard.build import main
from lra_bench.leaderboard.published import FIVE_TASKS
from lra_bench.record import results
from tests.conftest import compose

# The data part of every fixture's identity (a prepared data module's tokens' digest).
DATA_MODULE = SimpleNamespace(data_info=lambda: {"source": None}, tokens="0123456789abcdef")
NYSTROM = "nystrom / segment_means (m=64)"
SKY_NYSTROM = "nystrom / segment_means (m=128)"  # Skyformer's own size (conf/protocol_attn/skyformer_nystrom.yaml)


def _write(
    root: Path,
    name: str,
    overrides: list[str],
    acc: float,
    *,
    step_s: float = 0.05,
    peak: float = 500.0,
    seq_len: int = 1024,
) -> Path:
    """One completed run's `results.json`, built as `run.py` builds it, with the measured numbers given."""
    from lra_bench.config.spec import settle
    from lra_bench.run.rundir import data_identity_of

    spec = settle(compose(overrides), root / name)
    built = spec.described
    built.set_identity(spec.identify(data_identity_of(DATA_MODULE)))
    record = built.to_dict()
    record["status"] = "completed"
    record["run"].update(finished_at="2026-01-02T00:00:00")
    record["metrics"].update(
        test_acc=acc, val_acc=acc, step_time_median_s=step_s, tokens_per_s=1000.0 / step_s, peak_memory_mib=peak
    )
    record["data"]["seq_len"] = seq_len
    record["env"] = {"hardware": {"cpu": "test cpu", "gpus": []}}
    results.write_atomic(root / name / results.FILENAME, record)
    return root / name


def _board(runs: Path, out: Path) -> dict[str, Any]:
    """`python -m lra_bench.leaderboard RUNS --out OUT --no-plots`, in-process; the files it wrote."""
    assert main([str(runs), "--out", str(out), "--no-plots"]) == 0
    return {
        "md": (out / "leaderboard.md").read_text(),
        "csv": _csv(out / "leaderboard.csv"),
        "wide": [r for r in _csv(out / "leaderboard_wide.csv") if r["kind"] == "ours"],
        "reproduced": _csv(out / "leaderboard_reproduced.csv"),
    }


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _between(text: str, start: str, end: str | None = None) -> str:
    assert start in text, start
    tail = text.split(start, 1)[1]
    return tail.split(end, 1)[0] if end is not None and end in tail else tail


def _table_rows(section: str) -> dict[str, list[str]]:
    """`{first cell: cells}` of the markdown table rows in `section`."""
    rows = {}
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            rows[cells[0]] = cells
    return rows


# -- item 2: ranks only among on-protocol rows of one protocol and task --------------------------------------------
@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two protocols; on nystromformer/listops an on-protocol full and gpa and an off-protocol nystrom (2500 steps)
    that beats both, two seeds each; skyformer/listops: an on-protocol full and nystrom."""
    root = tmp_path_factory.mktemp("mixed")
    runs = root / "runs"
    for seed, (full, gpa, off) in enumerate(((0.400, 0.300, 0.500), (0.402, 0.302, 0.502))):
        _write(runs, f"full_{seed}", ["attn=full", f"seed={seed}"], full, step_s=0.10, peak=900.0)
        _write(runs, f"gpa_{seed}", ["attn=gpa", f"seed={seed}"], gpa, step_s=0.04, peak=250.0)
        _write(runs, f"nys2500_{seed}", ["attn=nystrom", "trainer.max_steps=2500", f"seed={seed}"], off, step_s=0.05)
        sky = ["protocol=skyformer", f"seed={seed}"]
        _write(runs, f"sky_full_{seed}", ["attn=full", *sky], 0.360 + 0.001 * seed, step_s=0.10, peak=900.0)
        _write(runs, f"sky_nys_{seed}", ["attn=nystrom", *sky], 0.379 + 0.001 * seed, step_s=0.05, peak=300.0)
    return _board(runs, root / "board")


def test_ranks_are_among_on_protocol_rows_of_one_protocol_and_task(mixed: dict[str, Any]) -> None:
    ranks = {(r["protocol"], r["attn"], r["conformance"]): r["rank"] for r in mixed["csv"]}
    assert ranks[("nystromformer", "full", "on")] == "1"  # the off-protocol nystrom above it does not count
    assert ranks[("nystromformer", "gpa", "on")] == "2"
    assert ranks[("nystromformer", "nystrom", "off")] == ""  # off-protocol: not ranked
    assert ranks[("skyformer", "nystrom", "on")] == "1" and ranks[("skyformer", "full", "on")] == "2"
    wide = {(r["protocol"], r["attn"], r["conformance"]): r for r in mixed["wide"]}
    assert wide[("nystromformer", "full", "on")]["listops_rank"] == "1"
    assert wide[("nystromformer", "gpa", "on")]["listops_rank"] == "2"
    assert wide[("nystromformer", "nystrom", "off")]["listops_rank"] == ""
    assert wide[("nystromformer", "nystrom", "off")]["off_protocol"] == "True"  # the CSVs carry the mark
    section = _between(mixed["md"], "## Ranking with uncertainty (ours)", "## Speed, accuracy and memory")
    nystromformer = _between(section, "### protocol: nystromformer", "### protocol: skyformer")
    ranked = _table_rows(nystromformer.split("#### protocol: nystromformer — not ranked")[0])
    assert ranked["full"][1].endswith("#1") and ranked["gpa / gpa (m=11)"][1].endswith("#2")
    assert not any("⚠" in name or NYSTROM in name for name in ranked)
    apart = _table_rows(_between(nystromformer, "#### protocol: nystromformer — not ranked"))
    (cell,) = [cells[1] for name, cells in apart.items() if name == f"{NYSTROM} ⚠ off-protocol"]
    assert cell.startswith("50.10 [") and "#" not in cell  # its interval, no rank


# -- item 3: the Pareto chart's speed reference, labels and frontier -----------------------------------------------
def _chart(md: str, title: str) -> dict[str, list[str]]:
    section = _between(md, "## Speed, accuracy and memory")
    return {
        k: v for k, v in _table_rows(_between(section, f"### {title}", "Pareto frontier:")).items() if k != "method"
    }


def test_pareto_reference_is_the_on_protocol_full_of_its_key(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for task in FIVE_TASKS:
        _write(runs, f"full_{task}", ["attn=full", f"task={task}"], 0.50, step_s=0.10, peak=900.0)
        _write(runs, f"nys_{task}", ["attn=nystrom", f"task={task}"], 0.49, step_s=0.05, peak=300.0)
        slow = ["attn=nystrom", f"task={task}", "trainer.max_steps=2500"]
        _write(runs, f"nys2500_{task}", slow, 0.52, step_s=0.40, peak=300.0)
    # an off-protocol bf16 full: faster and more accurate, the same method label before the fix
    _write(runs, "full_bf16", ["attn=full", "trainer.precision=bf16-mixed"], 0.60, step_s=0.02, peak=400.0)
    # skyformer: only an off-protocol full, so nystrom there has no reference at all
    _write(runs, "sky_full_bf16", ["attn=full", "protocol=skyformer", "trainer.precision=bf16-mixed"], 0.5, step_s=0.02)
    _write(runs, "sky_nys", ["attn=nystrom", "protocol=skyformer"], 0.4, step_s=0.05)
    md = _board(runs, tmp_path / "board")["md"]

    listops = _chart(md, "ListOps [nystromformer]")
    assert listops[NYSTROM][1] == "2.00×"  # 0.10 s / 0.05 s against the on-protocol full
    assert listops["full"][1] == "1.00×"
    bf16 = listops["full ⚠ off-protocol"]  # the mark in its label: not the on-protocol full's
    assert bf16[1] == "5.00×" and bf16[5] == ""  # drawn, never on the frontier
    assert listops[f"{NYSTROM} ⚠ off-protocol"][1] == "0.25×"
    frontier = _between(_between(md, "### ListOps [nystromformer]"), "Pareto frontier:", "\n")
    assert frontier.strip() == f"full, {NYSTROM}."

    average = _chart(md, "LRA 5-task average (Path-X not counted) [nystromformer]")
    assert average[NYSTROM][1] == "2.00×" and average[NYSTROM][2] == "49.00"  # its own task rows, not the off ones
    assert average[f"{NYSTROM} ⚠ off-protocol"][1] == "0.25×" and average[f"{NYSTROM} ⚠ off-protocol"][5] == ""
    assert "[skyformer]" not in _between(md, "## Speed, accuracy and memory", "\n- ")  # no reference: no chart
    assert f"{SKY_NYSTROM} on listops [skyformer]: left out of the chart, no speed ratio drawn (no on-protocol " in md


# -- item 4: every experiment its own row, with a unique label ----------------------------------------------------
def test_experiments_agreeing_on_the_first_label_keys_stay_apart(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    # C differs from A and B in six keys that sort before trainer.max_steps; A and B differ only in max_steps, so
    # a label of the first six differing keys was the same for A and B.
    six = ["data.batch_size=16", "model.dim=32", "model.dropout=0.2", "optim.lr=0.002", "optim.warmup_steps=7"]
    _write(runs, "c", ["attn=nystrom", "trainer.max_steps=4", *six, "optim.weight_decay=0.1"], 0.20)
    _write(runs, "a", ["attn=nystrom", "trainer.max_steps=4"], 0.25)
    for seed, acc in ((0, 0.30), (1, 0.32)):  # B: two seeds
        _write(runs, f"b{seed}", ["attn=nystrom", "trainer.max_steps=8", f"seed={seed}"], acc)
    board = _board(runs, tmp_path / "board")
    variants = [r["variant"] for r in board["csv"]]
    assert len(variants) == 3 and len(set(variants)) == 3  # three experiments, three labels
    assert all("trainer.max_steps=" in r["variant_full"] for r in board["csv"])  # the legend names every key
    assert len(board["wide"]) == 3  # nothing merged
    assert sorted(r["listops"] for r in board["wide"]) == ["20.0", "25.0", "31.0"]
    b = next(r for r in board["csv"] if r["n"] == "2")
    assert f"{b['variant']}]" in _between(board["md"], "## Ranking with uncertainty (ours)", "## Published")
    assert f"- `{b['variant']}`: " in board["md"] and "trainer.max_steps=8" in board["md"]  # the legend
    apart = _between(board["md"], "#### protocol: nystromformer — not comparable", "## Ranking")
    assert "31.00 ± 1.41 (n=2)" in apart


def test_wide_rows_never_overwrite_an_experiment_whose_label_clashes() -> None:
    """A clash that survives the labels (e.g. hand-made rows) still gives two method rows, not one."""
    from lra_bench.leaderboard.aggregate import wide_rows

    base = {"protocol": "p", "task": "listops", "attn": "nystrom", "selector": None, "rank_budget": 8,
            "pretraining": "none", "conformance": "off", "variant": "x=1", "test_acc_std": None, "n": 1}  # fmt: skip
    rows = [{**base, "fingerprint": "a" * 16, "test_acc_mean": 20.0}, {**base, "fingerprint": "b" * 16,
            "test_acc_mean": 30.0}]  # fmt: skip
    wide = wide_rows(rows, [])
    assert sorted(w["listops"] for w in wide) == [20.0, 30.0] and len({w["method"] for w in wide}) == 2


# -- item 5: reproduced or not, and the averaging convention --------------------------------------------------------
def test_reproduction_verdict_is_the_t_interval_over_seeds() -> None:
    from lra_bench.leaderboard.reproduced import reproduction_interval, reproduction_verdict

    accs = [37.0, 37.3, 37.5]
    half = stats.t.ppf(0.975, 2) * np.std(accs, ddof=1) / math.sqrt(3)
    assert reproduction_interval(accs) == pytest.approx((np.mean(accs) - half, np.mean(accs) + half))
    assert reproduction_verdict(accs, 37.15).startswith("reproduced")
    assert reproduction_verdict(accs, 40.0) == "not reproduced: published above our 95% CI"
    assert reproduction_verdict(accs, 30.0) == "not reproduced: published below our 95% CI"
    assert reproduction_verdict([37.0], 37.0) == "1 seed: cannot tell" and reproduction_interval([37.0]) is None


def test_an_interval_wider_than_the_margin_reproduces_nothing() -> None:
    """Two seeds of which one learned ListOps (36.20) and one stayed at the class prior (17.10): their interval
    (about −84 to 137) holds every published number, so it confirms none."""
    from lra_bench.leaderboard.reproduced import MARGIN_PP, reproduction_interval, reproduction_verdict

    low, high = reproduction_interval([36.20, 17.10]) or (0.0, 0.0)
    assert low < 18.80 < 37.15 < high
    for published in (37.15, 18.80):
        assert reproduction_verdict([36.20, 17.10], published).startswith("cannot tell: our 95% CI holds published")
    # within the margin on both sides: reproduced; an interval just reaching past it: cannot tell
    assert reproduction_verdict([37.0, 37.2, 37.4], 37.2).startswith("reproduced")
    edge = [37.2 - MARGIN_PP / 2, 37.2 + MARGIN_PP / 2, 37.2]  # sd 1 pp over 3 seeds: half-width 2.48 pp
    assert reproduction_verdict(edge, 37.2).startswith("cannot tell")


def test_published_numbers_say_whether_our_on_protocol_runs_reproduce_them(mixed: dict[str, Any]) -> None:
    verdicts = {(r["protocol"], r["published_source"], r["method"], r["target"]): r for r in mixed["reproduced"]}
    # skyformer nystrom, listops 37.90 ± … (seeds 37.9, 38.0) against Skyformer Table 1's 37.95: inside
    sky = verdicts[("skyformer", "Skyformer Table 1", SKY_NYSTROM, "listops")]
    assert sky["verdict"].startswith("reproduced") and float(sky["published"]) == pytest.approx(37.95)
    full = verdicts[("skyformer", "Skyformer Table 1", "full", "listops")]  # 36.0, 36.1 vs 38.71
    assert full["verdict"] == "not reproduced: published above our 95% CI"
    # the off-protocol nystrom of nystromformer is never said to reproduce (or not) Nyströmformer Table 3
    assert not any(k[0] == "nystromformer" and k[2].startswith("nystrom") for k in verdicts)
    assert {r["protocol"] for r in mixed["reproduced"]} == {"nystromformer", "skyformer"}
    block = _between(mixed["md"], "#### protocol: skyformer — do our runs reproduce the published numbers?", "\n## ")
    row = _table_rows(block)["Nyströmformer (Skyformer Table 1)"]
    assert row[1:4] == ["ListOps", "37.95", SKY_NYSTROM] and row[5].startswith("reproduced")
    assert "Avg-5 = mean of the five tasks without Path-X" in block and "Path-X FAIL or not run = 50" in block
    # where an average is shown, its convention is stated
    ranking = _between(mixed["md"], "## Ranking with uncertainty (ours)", "## Speed")
    assert "mean over all six tasks with Path-X failed or not run counted as 50" in ranking


def test_one_seed_cannot_tell(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _write(runs, "nys", ["attn=nystrom"], 0.3715)
    board = _board(runs, tmp_path / "board")
    (row,) = [r for r in board["reproduced"] if r["target"] == "listops"]
    assert (row["published_source"], row["verdict"], row["n"]) == ("Nyströmformer Table 3", "1 seed: cannot tell", "1")
    block = _between(board["md"], "#### protocol: nystromformer — do our runs reproduce", "\n## ")
    row = _table_rows(block)["Nyströmformer (Nyströmformer Table 3)"]
    assert row[1:] == ["ListOps", "37.15", NYSTROM, "37.15 (n=1)", "1 seed: cannot tell"]
