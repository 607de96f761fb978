"""`curves.png` beside a run's record: train loss and val accuracy against step, the best-val step marked.

Drawn at the end of every run that completes or fails (one stopped by SIGTERM/Ctrl-C draws them when its resumed
run ends: drawing while a second Ctrl-C may arrive would risk the exit status 130/143) from the run's own CSV metrics
(`<run dir>/csv/version_*/metrics.csv`, one version per attempt), so a glance says whether the model learned, when
it stopped improving, and whether the schedule was long enough — without W&B. A resumed run's attempts are joined:
an attempt's rows replace the earlier attempt's rows from its first logged step on (the steps it re-ran after the
checkpoint it resumed from). Nothing is drawn without the CSV logger (`logger.csv=false`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd

from lra_bench.kit.figures import agg_figure
from lra_bench.record.reader import typed
from tasks.files import atomic_path

FILENAME = "curves.png"
CSV_DIR = "csv"
TRAIN_LOSS, VAL_LOSS, VAL_ACC = "train/loss", "val/loss", "val/acc"


def _version(path: Path) -> int:
    match = re.fullmatch(r"version_(\d+)", path.parent.name)
    return int(match.group(1)) if match else -1


def read_metrics(run_dir: Path) -> pd.DataFrame | None:
    """Every attempt's logged rows as one frame sorted by step (later attempts win on re-run steps); None when the
    run logged no CSV. `step` counts the optimizer steps done, as the record and the checkpoint names do. Only
    training and validation rows are kept: the rows written after training (efficiency, test) use another step
    convention and belong to no curve."""
    files = sorted((Path(run_dir) / CSV_DIR).glob("version_*/metrics.csv"), key=_version)
    frames: list[pd.DataFrame] = []
    for path in files:
        try:
            frame = pd.read_csv(path)
        except (pd.errors.EmptyDataError, pd.errors.ParserError, OSError):
            continue  # an attempt killed before its first row
        if "step" not in frame or frame.empty:
            continue
        first = frame["step"].min()
        frames = [f[f["step"] < first] for f in frames]
        frames.append(frame)
    if not frames:
        return None
    metrics = pd.concat(frames, ignore_index=True)
    during = metrics.filter(regex=r"^(train|val)/").notna().any(axis=1)
    metrics = metrics[during].sort_values("step", kind="stable").reset_index(drop=True)
    metrics["step"] += 1  # Lightning logs the index of the step just taken; the record counts steps done
    return metrics


def evaluations(run_dir: Path) -> pd.DataFrame:
    """step → validation loss and accuracy of every evaluation in the run's CSV metrics (`read_metrics`: its attempts
    joined); no rows when it logged none."""
    metrics = read_metrics(run_dir)
    if metrics is None or VAL_ACC not in metrics:
        return pd.DataFrame(columns=[VAL_LOSS, VAL_ACC], dtype=float)
    evaluated = metrics[metrics[VAL_ACC].notna()].reindex(columns=["step", VAL_LOSS, VAL_ACC])
    return evaluated.groupby("step")[[VAL_LOSS, VAL_ACC]].last().astype(float)


def _series(metrics: pd.DataFrame, column: str) -> pd.DataFrame:
    if column not in metrics:
        return pd.DataFrame(columns=["step", column])
    return metrics.loc[metrics[column].notna(), ["step", column]]


def write_curves(run_dir: Path, record: dict[str, Any]) -> Path | None:
    """Draw `<run dir>/curves.png`; return its path, or None when there is nothing to draw."""
    metrics = read_metrics(run_dir)
    if metrics is None:
        return None
    loss, acc = _series(metrics, TRAIN_LOSS), _series(metrics, VAL_ACC)
    if loss.empty and acc.empty:
        return None
    fig = agg_figure(figsize=(10, 3.8), layout="constrained")
    left, right = fig.subplots(1, 2)
    left.plot(loss["step"], loss[TRAIN_LOSS], color="C0", lw=1.2)
    if loss.empty:
        note = "no train loss logged yet\n(every trainer.log_every_n_steps)"
        left.text(0.5, 0.5, note, ha="center", va="center", transform=left.transAxes)
    left.set(xlabel="step", ylabel="train loss (cross-entropy)", title="train loss")
    right.plot(acc["step"], 100 * acc[VAL_ACC], "o-", color="C1", ms=3, lw=1.2, label="val accuracy")
    read = typed(record)
    majority = read.data.get("majority_share")
    if majority is not None:
        right.axhline(100 * majority, color="grey", ls=":", lw=1, label=f"majority class {100 * majority:.1f}%")
    if not acc.empty:
        # the first step at the best value, as the best-val checkpoint
        best = acc.iloc[int(acc[VAL_ACC].to_numpy().argmax())]
        step, value = int(best["step"]), 100 * float(best[VAL_ACC])
        recorded = read.metrics.best_step
        if recorded is not None and (acc["step"] == recorded).any():  # the step the tested checkpoint was saved at
            step, value = int(recorded), 100 * float(acc.loc[acc["step"] == recorded, VAL_ACC].iloc[-1])
        for ax in (left, right):
            ax.axvline(step, color="C3", ls="--", lw=1)
        right.plot([step], [value], "*", color="C3", ms=12, label=f"best val {value:.2f}% at step {step}")
    right.set(xlabel="step", ylabel="val accuracy (%)", title="validation accuracy")
    # the legend outside the axes, so it hides no point
    right.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    selector = f" · {record['selector']}" if record.get("selector") else ""
    title = f"{record.get('task')} · {record.get('attn')}{selector}"
    fig.suptitle(f"{title} — {record.get('status')}", fontsize="medium")
    path = Path(run_dir) / FILENAME
    with atomic_path(path) as tmp:  # a reader never sees half a picture
        fig.savefig(tmp, format="png", dpi=100)
    return path
