"""The committed reproductions are what they claim (on-protocol, complete, their accuracy is their predictions'),
`docs/reproductions.md` is generated from them, and `make reproduce`'s snapshot/restore/evidence cycle works on
a real run (interrupted, resumed from the committed snapshot, completed).

Runs of a network the protocol no longer computes stay committed as a named variant
(`reproductions/variants/<name>/…`, their records say so) and are never counted beside a published row; the page
says which ListOps data the runs used, and a record of generated data never calls it official."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lra_bench import reproduce, reproduction_claims, reproductions
from lra_bench.stats.power import seeds_per_arm
from tests.conftest import REPO, fault, write_listops

EVIDENCE = REPO / "reproductions"
#: the current protocol's runs, then every variant's (`reproductions/variants/<name>/<protocol>/<task>/<attn>/…`)
FAITHFUL = sorted(p for p in EVIDENCE.glob("*/*/*/seed-*/results.json") if p.parts[-5] != reproductions.VARIANTS)
VARIANT = sorted(EVIDENCE.glob(f"{reproductions.VARIANTS}/*/*/*/*/seed-*/results.json"))
COMMITTED = FAITHFUL + VARIANT
#: every committed record, a snapshot's too
RECORDS = sorted(EVIDENCE.rglob("results.json"))


@pytest.mark.parametrize("record_path", COMMITTED, ids=[str(p.parent.relative_to(REPO)) for p in COMMITTED])
def test_a_committed_reproduction_is_complete_on_protocol_and_its_predictions(record_path: Path) -> None:
    record = json.loads(record_path.read_text())
    protocol, task, attn = record_path.parts[-5:-2]
    assert (record["protocol"], record["task"], record["attn"]) == (protocol, task, attn)
    assert record["status"] == "completed"
    assert record["off_protocol"] is False and record["deviations"] == {}
    assert record["metrics"]["train_steps"] == record["config"]["trainer"]["max_steps"] == 5000
    saved = np.load(record_path.parent / "test_predictions.npz")
    assert len(saved["label"]) == record["metrics"]["test_examples"]
    assert record["metrics"]["test_acc"] == pytest.approx(float(np.mean(saved["pred"] == saved["label"])), abs=1e-9)
    assert not list(record_path.parent.rglob("*.ckpt")), "a completed reproduction keeps no checkpoints"


def test_an_in_progress_snapshot_is_on_protocol_and_resumable() -> None:
    for folder in EVIDENCE.glob("*/*/*/seed-*/in-progress"):
        record = json.loads((folder / "results.json").read_text())
        assert record["off_protocol"] is False, folder
        assert (folder / "checkpoints" / "last.ckpt").exists(), folder
        assert not (folder.parent / "results.json").exists(), f"{folder.parent}: completed and in progress at once"


def test_a_variant_is_marked_explained_and_keeps_no_checkpoint() -> None:
    """Each variant folder has a README; each of its records says the variant; its snapshots keep no checkpoint
    (another network's weights cannot resume) but what the last one said; no record of the protocol's own runs
    names a variant."""
    for folder in sorted(p for p in (EVIDENCE / reproductions.VARIANTS).glob("*") if p.is_dir()):
        assert (folder / "README.md").exists(), folder
        for path in folder.rglob("results.json"):
            assert json.loads(path.read_text()).get("variant") == folder.name, path
        assert not list(folder.rglob("*.ckpt")), f"{folder}: a variant's checkpoints cannot resume"
        for snapshot in folder.glob("*/*/*/seed-*/in-progress"):
            kept = json.loads((snapshot / reproductions.SNAPSHOT_PROGRESS).read_text())
            assert kept["global_step"] > 0 and kept["segments"], snapshot
            assert not (snapshot.parent / "results.json").exists(), f"{snapshot.parent}: completed and in progress"
    for path in FAITHFUL + sorted(EVIDENCE.glob("*/*/*/seed-*/in-progress/results.json")):
        assert "variant" not in json.loads(path.read_text()), f"{path}: a variant's record among the protocol's runs"


def test_the_pre_fidelity_runs_are_a_variant_and_nowhere_else() -> None:
    """The runs trained before the network matched the reference code sit in the variant `pre-fidelity`, so none
    is beside a published row (and `make reproduce` writes new runs to the protocol's own folders)."""
    variant = EVIDENCE / reproductions.VARIANTS / "pre-fidelity"
    moved = {str(p.relative_to(variant)) for p in variant.rglob("results.json")}
    assert "nystromformer/listops/nystrom/seed-0/results.json" in moved
    assert "nystromformer/listops/linformer/seed-1/in-progress/results.json" in moved
    for path in RECORDS:
        identity = json.loads((path.parent / "identity.json").read_text())["identity"]
        if identity.get("model.pooling") == "mean" and identity.get("protocol.name") == "nystromformer":
            assert path.is_relative_to(variant), f"{path}: a pre-fidelity network outside its variant"
    assert reproduce.evidence_dir("nystromformer", "listops", "nystrom", 0) == EVIDENCE / "nystromformer" / (
        "listops/nystrom/seed-0"
    )


def test_the_page_is_generated_from_the_evidence() -> None:
    page = REPO / "docs" / "reproductions.md"
    assert page.exists(), "docs/reproductions.md is missing: python -m lra_bench.reproductions"
    assert page.read_text() == reproductions.render(), (
        "docs/reproductions.md is stale: python -m lra_bench.reproductions"
    )
    assert reproductions.main(["--check"]) == 0
    for figure in re.findall(r"!\[[^]]*\]\(([^)]+\.png)\)", page.read_text()):
        assert (page.parent / figure).exists(), f"the page shows {figure}, which is not there"


def test_the_page_says_which_listops_data_the_runs_used() -> None:
    """The data paragraph: generated trees of the official distribution, not the release's test set; and the records
    say which (`data.origin`)."""
    page = (REPO / "docs" / "reproductions.md").read_text()
    data = page.split("## Data", 1)[1].split("\n## ", 1)[0]
    for said in (
        "trees generated by `tasks.generate.listops`",
        "the official distribution, sizes 96,000/2,000/2,000",
        "seed 0",
        "not on the LRA release's test set",
        "different test sets of the same distribution",
        "`data.origin`",
    ):
        assert said in data, said


@pytest.mark.parametrize("record_path", RECORDS, ids=[str(p.parent.relative_to(REPO)) for p in RECORDS])
def test_a_record_of_generated_data_never_says_official(record_path: Path) -> None:
    """Every committed ListOps record names its data's origin; generated trees are never 'official files'. The
    origin added to a variant's record after its run has the generator knobs of the default ListOps config (those
    the run's config says it used)."""
    from tasks.listops import ListOpsConfig, ListOpsDataModule

    record = json.loads(record_path.read_text())
    data = record["data"]
    if record["task"] != "listops":
        return
    assert data["origin"]["kind"] in ("generated", "official"), record_path
    if data["origin"]["kind"] == "generated":
        assert "official" not in data["split"] and data["split"].startswith("generated files"), data["split"]
        assert data["origin"]["generator"] == "tasks.generate.listops"
    if "origin_added" in data:
        knobs = ListOpsDataModule(ListOpsConfig(), "unused", "unused").generator_knobs()
        assert data["origin"]["knobs"] == knobs
        assert {k: record["config"]["task"][k] for k in knobs if k in record["config"]["task"]} == {
            k: v for k, v in knobs.items() if k != "generator_version"
        }


def _record(attn: str, seed: int, test_acc: float, variant: str | None = None) -> dict[str, Any]:
    """A minimal completed on-protocol ListOps record, as the page reads it."""
    record: dict[str, Any] = {
        "status": "completed",
        "protocol": "nystromformer",
        "task": "listops",
        "attn": attn,
        "seed": seed,
        "off_protocol": False,
        "metrics": {"test_acc": test_acc, "train_steps": 5000, "val_acc": test_acc, "best_step": 5000},
        "run": {"planned_steps": 5000, "segments": [], "finished_at": None},
        "config": {"trainer": {"precision": "32-true"}},
        "data": {"split": "generated files (train/val/test as generated)", "origin": {"kind": "generated"}},
    }
    return record | ({"variant": variant} if variant else {})


def _write(folder: Path, record: dict[str, Any]) -> None:
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(record))


def test_a_variant_run_is_never_counted_beside_a_published_row(tmp_path: Path) -> None:
    """One run of the current network, and two of a variant (one in the variant's folder, one that lies among the
    protocol's runs but whose record names the variant): the published row counts the first only; the variant's
    section shows the other two, without a verdict."""
    root = tmp_path / "evidence"
    _write(reproduce.evidence_dir("nystromformer", "listops", "nystrom", 0, root), _record("nystrom", 0, 0.37))
    _write(reproduce.evidence_dir("nystromformer", "listops", "nystrom", 1, root), _record("nystrom", 1, 0.30, "old"))
    variant_root = root / reproductions.VARIANTS / "old"
    _write(reproduce.evidence_dir("nystromformer", "listops", "nystrom", 2, variant_root), _record("nystrom", 2, 0.32))
    runs = reproductions.collect(root)
    assert [(r.seed, r.variant) for r in runs] == [(0, None), (1, "old"), (2, "old")]
    page = reproductions.render(root, figure=None)
    main, variant = page.split("## Variant: old (not counted)")
    assert "| nystrom | 37.15 | 37.00 | 1 / 0 | — | 1 seed: cannot tell |" in main
    assert "seed-1" not in main and "seed-2" not in main
    assert "| nystrom | 31.00 [18.29, 43.71] | 2 / 0 |" in variant
    assert "37.15" not in variant and "reproduced" not in variant and "cannot tell" not in variant
    assert "| nystromformer/listops/nystrom/seed-1 | completed |" in variant
    rows = reproductions.summary_table(runs, [("nystromformer", "listops")])
    assert "| nystrom | 37.15 | 37.00 | 1 / 0 | — | 1 seed: cannot tell |" in rows


def test_the_page_with_no_run_of_the_current_network(tmp_path: Path) -> None:
    """Only a variant's runs, or none at all: every section still renders — the published rows with no number of
    ours, no runs table, no figure, no comparison — and the figure of a section without curves is not written."""
    root = tmp_path / "evidence"
    for page in (reproductions.render(root), reproductions.render(root, figure=None)):
        assert "No completed seed yet" in page and "| nystrom | 37.15 | — | 0 / 0 | — | not run yet |" in page
        assert "No runs yet." in page and ".png" not in page and "## Variant" not in page
        assert "needs completed runs of both (now 0 and 0)" in page and "## Data" in page
    variant_root = root / reproductions.VARIANTS / "old"
    _write(reproduce.evidence_dir("nystromformer", "listops", "gpa", 0, variant_root), _record("gpa", 0, 0.36))
    page = reproductions.render(root)
    assert "No completed seed yet" in page and "| gpa | — | — | 0 / 0 | — | — |" in page
    assert "## Variant: old (not counted)" in page and "| gpa | 36.00 | 1 / 0 |" in page
    out = tmp_path / "docs" / "reproductions.md"
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / reproductions.FIGURE_NAME).write_bytes(b"stale")
    assert reproductions.main(["--root", str(root), "--out", str(out)]) == 0
    assert not (tmp_path / "docs" / reproductions.FIGURE_NAME).exists(), "a stale figure of no runs is removed"
    assert reproductions.main(["--root", str(root), "--out", str(out), "--check"]) == 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_make_reproduce_snapshots_resumes_from_the_snapshot_and_keeps_the_evidence(tmp_path: Path) -> None:
    """A real `python -m lra_bench.reproduce` (small trial overrides): SIGTERM mid-run leaves a resumable snapshot;
    with the work dir gone (another machine), the same command restores it, resumes, completes, and leaves only the
    evidence files; the page generator reads them."""
    data = write_listops(tmp_path / "data", evaluation=32, max_length=120)
    trial = [
        "trainer.max_steps=24",
        "trainer.val_check_interval=4",
        "trainer.limit_val_batches=1",
        "task.seq_len=128",
        "task.max_length=120",
        "data.batch_size=8",
        "optim.warmup_steps=4",  # the protocol's OneCycleLR needs a warm-up shorter than the trial's 24 steps
        *fault(step_sleep_s=0.3),
    ]
    args = [
        sys.executable,
        "-m",
        "lra_bench.reproduce",
        "--data-dir",
        str(data),
        "--evidence-root",
        str(tmp_path / "evidence"),
        "--work-root",
        str(tmp_path / "work"),
        "--snapshot-every-s",
        "1",
    ]
    args += [f"--override={o}" for o in trial]
    evidence = reproduce.evidence_dir("nystromformer", "listops", "nystrom", 0, tmp_path / "evidence")
    env = {**os.environ, "WANDB_MODE": "disabled"}
    first = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not (evidence / "in-progress" / "checkpoints" / "last.ckpt").exists():
        assert first.poll() is None and time.monotonic() < deadline, first.stdout.read() if first.stdout else ""
        time.sleep(0.2)
    first.send_signal(signal.SIGTERM)
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 143, out[-3000:]
    snapshot = json.loads((evidence / "in-progress" / "results.json").read_text())
    assert snapshot["status"] == "interrupted"
    stopped_at = snapshot["run"]["segments"][-1]["to_step"]
    assert 0 < stopped_at < 24

    import shutil

    shutil.rmtree(tmp_path / "work")  # the run dir is gone: only the committed snapshot is left
    second = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    assert "restored the committed snapshot" in second.stdout
    record = json.loads((evidence / "results.json").read_text())
    assert record["status"] == "completed" and record["metrics"]["train_steps"] == 24
    assert [s["from_step"] for s in record["run"]["segments"]] == [0, stopped_at]
    assert sorted(p.name for p in evidence.iterdir()) == sorted(reproduce.EVIDENCE)
    approx = reproductions.read_approx(evidence)  # the study of the best-val checkpoint, made before the copy
    assert approx is not None and approx["attn"] == "nystrom" and approx["output_error"]["mean"] > 0
    runs = reproductions.collect(tmp_path / "evidence")
    assert len(runs) == 1 and runs[0].completed and (runs[0].wall_s() or 0.0) > 24 * 0.3
    page = reproductions.render(tmp_path / "evidence")
    assert "| nystrom | 37.15 | — | 0 / 0 | — | not run yet |" in page  # an off-protocol trial never stands beside it
    assert "| nystromformer/listops/nystrom/seed-0 | completed | 24/24 |" in page and "| **no** |" in page


def _completed(attn: str, seed: int, test_acc: float) -> reproductions.Run:
    record = {"status": "completed", "metrics": {"test_acc": test_acc}}
    return reproductions.Run("p", "listops", attn, seed, record, Path(f"seed-{seed}"))


def test_the_page_says_how_many_seeds_a_one_point_difference_needs() -> None:
    """From the pooled seed sd of both methods (here 1 pp in each), the t-test's sample size (G*Power: d = 1 → 17);
    with fewer than 2 seeds of either, it says the spread is not measured yet."""
    gpa = [_completed("gpa", s, a) for s, a in enumerate((0.36, 0.37, 0.38))]
    nystrom = [_completed("nystrom", s, a) for s, a in enumerate((0.365, 0.375))]
    nystrom_sd = float(np.std([36.5, 37.5], ddof=1))
    line = reproduction_claims.seeds_needed(gpa, nystrom, "gpa", "nystrom")
    pooled = ((2 * 1.0**2 + 1 * nystrom_sd**2) / 3) ** 0.5
    assert f"pooled seed sd {pooled:.2f} pp" in line
    assert f"{seeds_per_arm(1.0, pooled)} seeds per method" in line
    line = reproduction_claims.seeds_needed(gpa, nystrom[:1], "gpa", "nystrom")
    assert "unknown until each method has 2 completed seeds" in line and "now 3 and 1" in line


def test_the_curve_figures_legend_sits_beside_the_axes_and_covers_no_curve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The legend sat in the lower right, over the curves that rise there; now it is outside the axes, and still
    inside the saved figure (nothing of it cut off), however many runs it names."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    figures: list[Any] = []
    save = reproductions.save_figure

    def keep(fig: Any, path: Path) -> Path:
        figures.append(fig)
        return save(fig, path)

    monkeypatch.setattr(reproductions, "save_figure", keep)
    steps = range(0, 5001, 250)
    for n in (3, 30):  # a few runs, and more than one column of legend entries holds
        runs = []
        for i in range(n):  # curves from the bottom of the axes to the top, over its whole width
            curve = [(s, 0.1 + 0.8 * (i / max(n - 1, 1)) * s / 5000) for s in steps]
            record = {"status": "completed" if i % 2 else "running", "metrics": {}}
            runs.append(reproductions.Run("nystromformer", "listops", f"attn{i}", i, record, Path(f"seed-{i}"), curve))
        path = tmp_path / f"curves-{n}.png"
        reproductions.plot(runs, path)
        assert path.read_bytes()[:4] == b"\x89PNG"
        fig = figures[-1]
        canvas = FigureCanvasAgg(fig)  # the saved layout, drawn again (closing the figure dropped its canvas)
        canvas.draw()
        renderer = canvas.get_renderer()
        (ax,) = fig.axes
        legend = ax.get_legend()
        assert legend is not None and len(legend.get_texts()) == n
        box = legend.get_window_extent(renderer)
        assert not box.overlaps(ax.get_window_extent(renderer)), f"{n} runs: the legend lies over the curves"
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1


def test_the_table_says_how_many_seeds_learned_the_task() -> None:
    """Two completed nystrom seeds, one that left the class prior (val 0.37 at step 2750) and one that stayed there:
    the row says `1 of 2`, its verdict is *cannot tell* (the interval holds 37.15 but spans tens of points), and a
    note under the table says one seed never learned. A run whose record gives no prior is not judged."""
    prior = {"majority_share": 0.18}
    learned = [(s, 0.18 if s < 2750 else 0.37) for s in range(50, 5001, 50)]
    stuck = [(s, 0.18) for s in range(50, 5001, 50)]
    runs = []
    for seed, acc, curve in ((0, 0.362, learned), (1, 0.171, stuck)):
        record = _record("nystrom", seed, acc)
        record["data"] |= prior
        runs.append(reproductions.Run("nystromformer", "listops", "nystrom", seed, record, Path(f"s{seed}"), curve))
    unjudged = reproductions.Run("nystromformer", "listops", "gpa", 0, _record("gpa", 0, 0.36), Path("g"), stuck)
    lines = "\n".join(reproductions.summary_table([*runs, unjudged]))
    (row,) = [line for line in lines.splitlines() if line.startswith("| nystrom |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3:] == ["2 / 0", "1 of 2", "cannot tell: our 95% CI holds published but reaches beyond ± 2 pp of it"]
    assert "| gpa | — | 36.00 | 1 / 0 | — | — |" in lines
    assert "Of the 2 completed seeds above, 1 never left the class prior" in lines
    runs[1].curve[:] = learned  # both learned: no note
    assert "never left the class prior" not in "\n".join(reproductions.summary_table(runs))


def _with_curve(folder: Path, record: dict[str, Any], curve: list[tuple[int, float, float]]) -> None:
    """A run's record and its CSV metrics as Lightning's CSVLogger writes them (each row logged at the index of the
    step just taken: one less than the steps done)."""
    _write(folder, record)
    (folder / "csv" / "version_0").mkdir(parents=True)
    rows = [f"{step - 1},{loss},{acc}" for step, loss, acc in curve]
    (folder / "csv" / "version_0" / "metrics.csv").write_text("\n".join(["step,val/loss,val/acc", *rows]) + "\n")


def test_a_kernel_path_variant_is_held_against_the_counted_seeds_curves(tmp_path: Path) -> None:
    """Two completed gpa seeds of the eager chain, and a fused-chain run of seed 0 cut off at step 150 (a variant's
    snapshot): each evaluation beside seed 0's and seed 1's, and the verdict from the largest distances — beyond the
    seeds' spread while its loss strays 0.03 from seed 0's (seed 1 strays 0.01), within it once it strays 0.005. A
    variant run that also differs in the network is another experiment: no such check."""
    root = tmp_path / "evidence"
    network = {"attn.name": "gpa", "model.hidden": 64, "task.name": "listops"}
    counted = {0: [(50, 2.28, 0.18), (100, 2.27, 0.18), (150, 2.26, 0.20)], 1: [(50, 2.29, 0.08), (100, 2.28, 0.18)]}
    counted[1].append((150, 2.27, 0.18))
    for seed, curve in counted.items():
        record = _record("gpa", seed, 0.36) | {"identity": network | {"seed": seed}}
        _with_curve(reproduce.evidence_dir("nystromformer", "listops", "gpa", seed, root), record, curve)
    variant_root = root / reproductions.VARIANTS / "fused-encoder"
    fused = _record("gpa", 0, 0.36, "fused-encoder") | {"status": "interrupted"}
    fused["identity"] = network | {"seed": 0, "model.kernels": "fused"}
    snapshot = reproduce.evidence_dir("nystromformer", "listops", "gpa", 0, variant_root) / reproductions.IN_PROGRESS
    _with_curve(snapshot, fused, [(50, 2.281, 0.18), (100, 2.30, 0.18), (150, 2.262, 0.17)])
    (snapshot / reproductions.SNAPSHOT_PROGRESS).write_text(json.dumps({"global_step": 150, "segments": [{}]}))

    page = reproductions.render(root, figure=None)
    main, variant = page.split("## Variant: fused-encoder (not counted)")
    assert "Against the counted seeds" not in main and "model.kernels=fused" in variant
    assert "| 50 | 2.2810 | 2.2800 | 2.2900 | 18.00 | 18.00 | 8.00 |" in variant
    assert "| 100 | 2.3000 | 2.2700 | 2.2800 | 18.00 | 18.00 | 18.00 |" in variant
    assert "| 150 | 2.2620 | 2.2600 | 2.2700 | 17.00 | 20.00 | 18.00 |" in variant
    said = "over 3 evaluations: its largest distance from seed 0's counted run is {} in loss and 3.00 pp in accuracy; "
    said += "the other counted seeds' (1) from it 0.0100 and 10.00 pp — **{} the seeds' spread**."
    assert said.format("0.0300", "beyond") in variant
    _with_curve(snapshot / "again", fused, [(50, 2.281, 0.18), (100, 2.275, 0.18), (150, 2.262, 0.17)])
    shutil.rmtree(snapshot / "csv")
    (snapshot / "again" / "csv").rename(snapshot / "csv")
    assert said.format("0.0050", "within") in reproductions.render(root, figure=None)
    fused["identity"]["model.hidden"] = 128  # another network, not a kernel path
    (snapshot / "results.json").write_text(json.dumps(fused))
    assert "Against the counted seeds" not in reproductions.render(root, figure=None)
