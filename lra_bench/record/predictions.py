"""Per-example test outputs: `test_predictions.npz` beside `results.json`, so any comparison can be recomputed.

Format `lra-bench/test-predictions/1` (numpy `.npz`, no pickles):

    format   0-d str    "lra-bench/test-predictions/1"
    label    int16 [N]  the true class of test example i (i = position in the task's test split)
    pred     int16 [N]  the class the evaluated checkpoint predicted (argmax of the logits)

Rows are in test-split order (the test loader never shuffles), so two runs on the same data (same data identity)
can be paired example by example (McNemar, permutation tests). About 4 bytes per example: 10k Image test
examples = 40 kB. `correct = pred == label`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.files import atomic_path

FILENAME = "test_predictions.npz"
FORMAT = "lra-bench/test-predictions/1"


@dataclass(frozen=True)
class Predictions:
    label: np.ndarray
    pred: np.ndarray

    @property
    def correct(self) -> np.ndarray:
        return self.pred == self.label

    @property
    def accuracy(self) -> float:
        return float(self.correct.mean()) if len(self.label) else float("nan")


def save_predictions(path: str | Path, label: np.ndarray, pred: np.ndarray) -> Path:
    """Write atomically (a temp file of this process beside `path`, then rename) with the umask's mode, like
    every output (group-readable for shared leaderboards)."""
    path = Path(path)
    label, pred = np.asarray(label), np.asarray(pred)
    if label.shape != pred.shape or label.ndim != 1:
        raise ValueError(f"label {label.shape} and pred {pred.shape} must be equal 1-d shapes")
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, format=np.array(FORMAT), label=label.astype(np.int16), pred=pred.astype(np.int16))
    return path


def load_predictions(path: str | Path) -> Predictions:
    with np.load(Path(path), allow_pickle=False) as data:
        fmt = str(data["format"]) if "format" in data else None
        if fmt != FORMAT:
            raise ValueError(f"{path}: format {fmt!r}, expected {FORMAT!r}")
        return Predictions(label=data["label"].astype(np.int64), pred=data["pred"].astype(np.int64))
