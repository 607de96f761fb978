"""How closely a reproduction's trained attention approximates exact softmax attention: `approx.json` beside its
evidence.

`python -m lra_bench.reproduce --approx-only …` (or `python -m lra_bench.reproduction_approx --run <run dir> --out
<file>`) rebuilds a completed reproduction's network from its work folder (`.hydra/config.yaml`, the best-val
checkpoint the test used), runs it in eval mode on the diagnostics' probe (the `PROBE_SEQUENCES` longest validation
sequences, cut to `PROBE_MAX_LEN` tokens) and compares every layer's and head's *own* operator Â (`implied_matrix`,
with the trained state: GPA's codebook, Linformer's projections) with exact softmax attention A on the same q, k, v
in fp64 (`lra_bench.diagnostics.metrics.head_metrics`, as `python -m lra_bench.approx`): output error
‖(A − Â)V‖_F / ‖AV‖_F (what the page sets beside test accuracy), matrix error ‖A − Â‖_F / ‖A‖_F, the numerical rank
of Â and A (#σ_i > `RANK_TOL`·σ_1) and the rank budget the method used — means and medians, no per-sequence values.
An attention that stands for another operator T than softmax and says which (`target_pair`: spectral's affinity,
Skyformer's Gaussian kernel) also gets its output error against T (`own_output_error`).

For `attn=full` Â is A: the error is 0 by definition (the fp32-vs-fp64 rounding is kept as `rounding`). Cost: two
n×n fp64 SVDs per sequence, layer and head — a minute or two on one CPU thread for the Nyströmformer ListOps model.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from lra_bench.kit.numbers import median_of
from lra_bench.record.checkpoint_file import CHECKPOINT_DIR, LAST, best_checkpoint_of
from lra_bench.record.provenance import git_commit, hardware

APPROX_FILE = "approx.json"
PROBE_SEQUENCES = 8  # the longest validation sequences …
PROBE_MAX_LEN = 1024  # … cut to this many tokens (the training-time diagnostics' cut)
RANK_TOL = 1.0e-3  # numerical rank: #σ_i > tol·σ_1 (the diagnostics' default)
SCHEMA_VERSION = 1
EXACT = "full"  # the attention whose Â is exact softmax attention


def best_checkpoint(run: Path) -> Path:
    """The run's best-val checkpoint: the one its `last.ckpt` names (ModelCheckpoint state), else the only, or the
    highest-step, `best-*.ckpt` in `checkpoints/`. FileNotFoundError when there is none."""
    ckpts = run / CHECKPOINT_DIR
    last = ckpts / LAST
    if last.exists():
        named = best_checkpoint_of(last)
        if named and (ckpts / named).exists():
            return ckpts / named
    found = sorted(ckpts.glob("best*.ckpt"), key=lambda p: (_step_in_name(p), p.name))
    if not found:
        raise FileNotFoundError(f"{run}: no best-val checkpoint (checkpoints/best-*.ckpt)")
    return found[-1]


def _step_in_name(path: Path) -> int:
    digits = "".join(c if c.isdigit() else " " for c in path.stem).split()
    return int(digits[-1]) if digits else -1


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _numbers(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [float(v) for r in rows if isinstance(v := r.get(key), int | float) and math.isfinite(float(v))]


def _stats(rows: list[dict[str, Any]], key: str) -> dict[str, float | None]:
    values = _numbers(rows, key)
    return {"mean": _mean(values), "median": median_of(values)}


def summarise(measured: dict[str, Any]) -> dict[str, Any]:
    """The small JSON's numbers: per layer/head and overall means and medians (no per-sequence values). For exact
    attention the errors are 0 by definition; the rounding measured is kept beside them."""
    diag, exact = measured["diag"], measured["attn"] == EXACT
    every: list[dict[str, Any]] = []
    layers = []
    for layer in diag["layers"]:
        heads = []
        for head in layer["heads"]:
            rows = head["sequences"]
            every += rows
            heads.append(
                {
                    "head": head["head"],
                    "sequences": len(rows),
                    "output_error_mean": 0.0 if exact else _mean(_numbers(rows, "output_residual")),
                    "output_error_median": 0.0 if exact else median_of(_numbers(rows, "output_residual")),
                    "matrix_error_mean": 0.0 if exact else _mean(_numbers(rows, "matrix_residual")),
                    "rank_a_hat_median": median_of(_numbers(rows, "rank_a_hat")),
                    "rank_budget_median": median_of(_numbers(rows, "rank_budget")),
                    "rank_a_median": median_of(_numbers(rows, "rank_a")),
                }
            )
        layers.append({"layer": layer["layer"], "heads": heads})
    output, matrix = _stats(every, "output_residual"), _stats(every, "matrix_residual")
    own = _stats(every, "target_output_residual")  # only an attention that stands for another operator has it
    rounding = None
    if exact:
        rounding = {"output_error_max": max(_numbers(every, "output_residual"), default=None)}
        output = matrix = {"mean": 0.0, "median": 0.0}
    nominal = _numbers(every, "rank_budget_nominal")
    return {
        "output_error": output,
        "matrix_error": matrix,
        "own_output_error": own if own["mean"] is not None else None,
        "by_definition": (
            "exact softmax attention: Â = A, so its error against exact attention is 0 by definition (reported as 0; "
            "`rounding` is the fp32-vs-fp64 difference measured)"
            if exact
            else None
        ),
        "rounding": rounding,
        "rank": {
            "a_hat_numerical_median": median_of(_numbers(every, "rank_a_hat")),
            "a_hat_numerical_mean": _mean(_numbers(every, "rank_a_hat")),
            "budget_effective_median": median_of(_numbers(every, "rank_budget")),
            "budget_nominal": max(nominal) if nominal else None,  # None: no budget (full rank)
            "a_numerical_median": median_of(_numbers(every, "rank_a")),
        },
        "evaluations": len(every),
        "layers": layers,
    }


def study(
    run: Path,
    sequences: int = PROBE_SEQUENCES,
    max_len: int = PROBE_MAX_LEN,
    threads: int = 1,
    data_dir: str | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    """`approx.json`'s content for the completed run in the work folder `run`."""
    # torch and the run's code only when a study runs: `make reproduce`, its sweep callback and the page import this
    from lra_bench.approx.capture import measure_checkpoint

    started = time.perf_counter()
    ckpt = best_checkpoint(run)
    measured = measure_checkpoint(ckpt, threads, sequences, max_len, RANK_TOL, data_dir)
    probe = measured["diag"]["probe"]
    data: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "what": (
            "the run's own trained attention (each layer and head's implied matrix Â) against exact softmax "
            "attention A on the same q, k, v, fp64: output error ‖(A − Â)V‖_F/‖AV‖_F, matrix error ‖A − Â‖_F/‖A‖_F, "
            "the numerical rank of Â (σ_i > rank_tol·σ_1) and the effective rank budget; for an attention that "
            "stands for another operator T than softmax (`target_pair`), own output error ‖(T − T̂)V‖_F/‖TV‖_F"
        ),
        "task": measured["task"],
        "attn": measured["attn"],
        "checkpoint": {
            "file": ckpt.name,
            "step": measured["step"],
            "rule": "the best-val checkpoint (the one the test used)",
            "run_val_acc": measured["run"].get("run_val_acc"),
        },
        "probe": {
            "sequences": probe["sequences"],
            "max_len": probe["max_len"],
            "lengths": probe["lengths"],
            "rule": f"the {sequences} longest validation sequences, cut to {max_len} tokens "
            "(the training-time diagnostics' probe rule), eval mode",
        },
        "rank_tol": RANK_TOL,
        **summarise(measured),
        "command": command or " ".join(["python -m lra_bench.reproduction_approx", "--run", str(run)]),
        "code": git_commit(),
        "machine": {k: v for k, v in hardware().items() if k in ("cpu", "cpu_capability", "cpu_count", "gpus")},
        "python": platform.python_version(),
        "threads": measured["threads"],
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    data["seconds"] = round(time.perf_counter() - started, 1)
    return data


def write(run: Path, out: Path, **kwargs: Any) -> Path:
    """Run the study on `run` and write it to `out` (atomically: a failed study leaves no file)."""
    data = study(run, **kwargs)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=float) + "\n")
    tmp.replace(out)
    return out


def read(folder: Path) -> dict[str, Any] | None:
    """A run's `approx.json` from its evidence folder (None when missing or unreadable)."""
    try:
        data = json.loads((folder / APPROX_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def output_error(data: dict[str, Any], key: str = "output_error") -> float | None:
    """The overall mean output error of an `approx.json` (`key="own_output_error"`: against the operator the
    attention stands for, where it is not softmax attention; None where the file has none)."""
    value = (data.get(key) or {}).get("mean")
    return float(value) if isinstance(value, int | float) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="the completed run's work folder")
    parser.add_argument("--out", type=Path, help=f"where to write (default: <run>/{APPROX_FILE})")
    parser.add_argument("--sequences", type=int, default=PROBE_SEQUENCES)
    parser.add_argument("--max-len", type=int, default=PROBE_MAX_LEN)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data-dir", help="read the task's data here instead of the run's data_dir")
    parser.add_argument("--command", help="the command line to record (default: this one)")
    args = parser.parse_args(argv)
    out = args.out or args.run / APPROX_FILE
    cmd = args.command or " ".join(["python -m lra_bench.reproduction_approx", *(argv or sys.argv[1:])])
    write(
        args.run,
        out,
        sequences=args.sequences,
        max_len=args.max_len,
        threads=args.threads,
        data_dir=args.data_dir,
        command=cmd,
    )
    data = json.loads(out.read_text())
    print(
        f"[approx] {out}: output error {output_error(data)} (mean over {data['evaluations']} sequence×layer×head), "
        f"rank of Â {data['rank']['a_hat_numerical_median']} (median), {data['seconds']} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
