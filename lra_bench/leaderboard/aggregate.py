"""Collect `results.json` records and aggregate them into leaderboard rows (no rendering here).

Why separate: the numbers (means, stds, averages, which runs failed) are what tests check by hand; the
markdown/CSV/plots only format them. Accuracies become percent here, once, so every output agrees. Which
records form one row is `lra_bench.leaderboard.experiments`' job: one experiment (fingerprint except seed) per
row, never a pool of several; evaluated checkpoints are listed apart and never counted as training runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from lra_bench.diagnostics import LOCALITY_KEYS
from lra_bench.kit.numbers import median_of
from lra_bench.leaderboard import experiments
from lra_bench.leaderboard.published import FIVE_TASKS, PATHX_FAIL_SCORE, TASKS, PublishedRow
from lra_bench.record import results
from lra_bench.record.identity import identity_of
from lra_bench.record.reader import typed
from lra_bench.record.table import as_percent, over_seeds, runs_table

#: the cell a row sits in (several rows per cell when experiments differ; see `experiments`)
GROUP_KEYS = ("protocol", "task", "attn", "selector", "rank_budget", "window", "pretraining")
METHOD_KEYS = ("protocol", "attn", "selector", "rank_budget", "window", "pretraining")
#: a wide (per-method) row: the method, whether its runs kept the protocol, and the variant that sets it apart
WIDE_KEYS = (*METHOD_KEYS, "conformance", "variant")
# Names a task may carry in a record, mapped to the canonical key (configs and older sweeps differ).
TASK_ALIASES = {
    "pathfinder32": "pathfinder",
    "pathfinder-32": "pathfinder",
    "path-x": "pathx",
    "path_x": "pathx",
    "pathfinder128": "pathx",
    "cifar10": "image",
    "imdb": "text",
    "aan": "retrieval",
}


def canonical_task(name: Any) -> str:
    text = str(name).strip().lower() if name is not None else "unknown"
    return TASK_ALIASES.get(text, text)


def find_results(dirs: Iterable[str | Path]) -> list[Path]:
    """Every `results.json` below the given dirs (recursively), each once, in a stable order."""
    roots = [Path(root) for root in dirs]
    paths = [path for root in roots for path in ([root] if root.is_file() else sorted(root.rglob(results.FILENAME)))]
    return list(dict.fromkeys(path.resolve() for path in paths))


def load_records(paths: Sequence[Path]) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Parse and validate each file; a bad file becomes an `unreadable` entry, never an exception."""
    records: list[dict[str, Any]] = []
    unreadable: list[dict[str, str]] = []
    for path in paths:
        try:
            record = results.read_record(path)
            if not isinstance(record, dict):
                raise ValueError(f"top level is {type(record).__name__}, not an object")
            missing = results.validate_record(record)
            if missing:
                raise ValueError(f"missing or invalid keys: {', '.join(missing)}")
        except (OSError, ValueError, TypeError, AttributeError) as err:  # JSONDecodeError is a ValueError
            unreadable.append({"path": str(path), "reason": f"{type(err).__name__}: {err}"})
            continue
        record["_path"] = str(path)
        record["task"] = canonical_task(record.get("task"))
        # how the encoder was pretrained (none | mlm | causal; none in records from before): self-pretrained rows
        # never pool with scratch rows
        record["pretraining"] = str(typed(record).pretraining)
        record["window"] = window_of(record)
        records.append(record)
    return records, unreadable


def window_of(record: dict[str, Any]) -> int | None:
    """A local-window run's `attn.window` (None for every other attention): like the rank budget, it says which
    method a row is — `local (w=16)` and `local (w=64)` are two methods, not two variants of one."""
    window = identity_of(record).get("attn.window")
    return int(window) if isinstance(window, int) and not isinstance(window, bool) else None


def _listed(record: dict[str, Any]) -> dict[str, Any]:
    """What a run listed apart from the rows (a failure, an evaluation) says first: where it ran, its status, cell."""
    output_dir = str(typed(record).run.output_dir or Path(record["_path"]).parent)
    return {"output_dir": output_dir, "status": record.get("status"), **{key: record.get(key) for key in GROUP_KEYS}}


def is_evaluation(record: dict[str, Any]) -> bool:
    """An evaluated checkpoint (its own record, status `evaluated`, or a failed evaluation): not a training run."""
    return record.get("status") == "evaluated" or record.get("evaluation") is not None


def evaluations_of(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Evaluation records, for their own list (never a row, never a failure of a training run)."""
    out = [
        {
            **_listed(rec),
            "checkpoint": (rec.get("evaluation") or {}).get("checkpoint"),
            "checkpoint_step": (rec.get("evaluation") or {}).get("checkpoint_step"),
            "test_acc": as_percent(typed(rec).metrics.test_acc),
            "reason": rec.get("error") or "",
        }
        for rec in records
        if is_evaluation(rec)
    ]
    return sorted(out, key=lambda r: r["output_dir"])


def failures_of(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Training runs whose status is not `completed`, with where they ran and why they stopped."""
    out = [
        {
            **_listed(rec),
            "reason": str(rec.get("error") or f"unfinished (status={rec.get('status')}, no error recorded)"),
            "seed": rec.get("seed"),
            "conformance": experiments.conformance(rec),
            "variant": "",
        }
        for rec in records
        if rec.get("status") != "completed" and not is_evaluation(rec)
    ]
    return sorted(out, key=lambda r: (str(r["protocol"]), task_order(r["task"]), str(r["attn"]), r["output_dir"]))


def task_order(task: str) -> tuple[int, str]:
    return (TASKS.index(task) if task in TASKS else len(TASKS), task)


def values_at(rec: Mapping[str, Any], keys: Sequence[str]) -> tuple[Any, ...]:
    """The values of `keys` in a record or row (None where absent): the key of its group, reference or cell."""
    return tuple(rec.get(k) for k in keys)


def _sort_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    protocol, task, attn, selector, landmarks, window, pretraining, conformance, fp = key
    order = experiments.CONFORMANCE.index(conformance)
    width = window if window is not None else -1  # local windows in increasing order
    return (str(protocol), task_order(task), str(attn), str(selector), str(landmarks), width, str(pretraining), order,
            fp)  # fmt: skip


def _runs_frame(records: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """The table of runs (`lra_bench.record.table.runs_table`) of the completed training runs, each with its row key
    (the group keys, conformance, fingerprint) and the seed it counts as."""
    # (a `stage=pretrain` run has a language-model objective and no task accuracy: not a row)
    kept = [
        rec
        for rec in records
        if rec.get("status") == "completed" and not is_evaluation(rec) and typed(rec).stage != "pretrain"
    ]
    frame = runs_table(kept)
    frame["key"] = [
        (*values_at(rec, GROUP_KEYS), experiments.conformance(rec), experiments.group_fingerprint(rec)) for rec in kept
    ]
    # a record without a seed is its own seed
    frame["seed_key"] = [rec.get("seed") if rec.get("seed") is not None else rec["_path"] for rec in kept]
    frame["seed_order"] = [str(rec.get("seed")) for rec in kept]
    return frame


def _dedupe_seeds(runs: pd.DataFrame) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """One run per seed of one experiment (same fingerprint and seed): the newest completed run wins."""
    ordered = runs.sort_values(["finished_at", "path"], kind="stable")
    kept = ordered.drop_duplicates("seed_key", keep="last")
    winner = dict(zip(kept["seed_key"], kept["path"]))
    dropped = ordered[~ordered.index.isin(kept.index)]
    superseded = [
        {"path": path, "seed": rec.get("seed"), "kept": winner[seed_key]}
        for path, rec, seed_key in zip(dropped["path"], dropped["record"], dropped["seed_key"])
    ]
    return kept.sort_values(["seed_order", "path"], kind="stable"), superseded


def _value(number: float) -> float | None:
    """A pandas summary as a record value: NaN (no value, or the std of one seed: unknown, not 0) is None."""
    return None if pd.isna(number) else float(number)


#: how far a row's attention reaches (the diagnostics' locality values): the method's and the exact softmax's
REACH_KEYS = (*LOCALITY_KEYS, *(f"{key}_exact" for key in LOCALITY_KEYS))


def _reach(runs: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Median over seeds of each run's diagnostics summary (at its best-validation checkpoint, the one its test
    accuracy comes from; the latest when none is marked best): None where no run has diagnostics."""
    summaries = [typed(rec).diagnostics_summary() for rec in runs]
    return {key: median_of(s.get(key) for s in summaries) for key in REACH_KEYS}


def _device(record: dict[str, Any]) -> str:
    hw = typed(record).env_part("hardware")
    return (hw.get("gpus") or [None])[0] or (f"cpu: {hw['cpu']}" if hw.get("cpu") else "unknown")


def group_rows(records: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Completed training runs, one row per experiment (fingerprint except seed) — see `experiments`. Each quantity
    over seeds by its one statistic (`lra_bench.record.table.OVER_SEEDS`, which compare and the reproductions page
    use too), beside the accuracies' sample standard deviations (ddof=1)."""
    groups = {tuple(runs["key"].iloc[0]): runs for _, runs in _runs_frame(records).groupby("key", sort=False)}
    rows, superseded = [], []
    for key in sorted(groups, key=_sort_key):
        runs, dropped = _dedupe_seeds(groups[key])
        superseded += dropped
        kept: list[dict[str, Any]] = list(runs["record"])
        test, val = runs["test"].dropna(), runs["val"].dropna()
        summary = over_seeds(runs)
        step, params = summary["step_time_median_s"], summary["params"]
        seq_lens = {typed(r).data.seq_len for r in kept}  # the Pareto chart's "same length"
        rows.append(
            {
                **dict(zip(GROUP_KEYS, key)),
                "conformance": key[len(GROUP_KEYS)],
                "fingerprint": key[len(GROUP_KEYS) + 1],
                "off_protocol": {"on": False, "off": True}.get(key[len(GROUP_KEYS)]),
                "deviations": ",".join(sorted({k for r in kept for k in r.get("deviations") or {}})),
                "_identity": identity_of(kept[0]),
                "n": len(test),
                "test_accs": [float(v) for v in test],  # per seed, in seed order: what a reproduction verdict needs
                "n_runs": len(kept),
                "seeds": ",".join(str(r.get("seed")) for r in kept),
                "test_acc_mean": summary["test"],
                "test_acc_std": _value(test.std(ddof=1)),
                "val_acc_mean": summary["val"],
                "val_acc_std": _value(val.std(ddof=1)),
                "step_time_median_ms": step * 1000.0 if step is not None else None,
                "tokens_per_s": summary["tokens_per_s"],
                "peak_memory_mib": summary["peak_memory_mib"],
                "params": None if params is None else int(params),
                "device": "; ".join(sorted({_device(r) for r in kept})),
                "seq_len": seq_lens.pop() if len(seq_lens) == 1 else None,
                **_reach(kept),
            }
        )
    experiments.label_rows(rows, GROUP_KEYS)
    for row in rows:
        del row["_identity"]
    return rows, superseded


def method_label(
    attn: Any, selector: Any, rank_budget: Any, variant: str = "", pretraining: Any = "none", window: Any = None
) -> str:
    parts = (
        (selector, f" / {selector}"),
        (rank_budget is not None, f" (m={rank_budget})"),
        (window is not None, f" (w={window})"),
        (pretraining not in (None, "none"), f" + SPT({pretraining})"),
        (variant, f" [{variant}]"),
    )
    return str(attn) + "".join(text for shown, text in parts if shown)


def row_label(row: Mapping[str, Any]) -> str:
    """`method_label` from a (group or wide) row's own keys."""
    variant, pretraining, window = row.get("variant") or "", row.get("pretraining"), row.get("window")
    return method_label(row.get("attn"), row.get("selector"), row.get("rank_budget"), variant, pretraining, window)


def average_columns(cells: Mapping[str, float | None]) -> dict[str, Any]:
    """A wide row's averages: `avg5`, the 5-task average (LRA convention), and `avg6`, the 6-task average with
    Path-X failed/absent = 50 (S4/Mega). Both need all five other tasks; `pathx_counted_as_50` says whether Path-X
    was counted as 50 (None without averages)."""
    five = [score for t in FIVE_TASKS if (score := cells.get(t)) is not None]
    if len(five) < len(FIVE_TASKS):
        return {"avg5": None, "avg6": None, "pathx_counted_as_50": None}
    pathx = cells.get("pathx")
    avg6 = statistics.fmean([*five, PATHX_FAIL_SCORE if pathx is None else pathx])
    return {"avg5": statistics.fmean(five), "avg6": avg6, "pathx_counted_as_50": pathx is None}


def wide_row(
    cells: Mapping[str, float | None], std: Mapping[str, Any], n: Mapping[str, Any], **fields: Any
) -> dict[str, Any]:
    """A row of the wide (per-method) table in the one shape ours, the published ones and the locality baseline
    share: `fields` (`conformance` among them) over the defaults, each task's cell, sd and seeds, both averages."""
    return {
        "selector": None,
        "variant": "",
        "deviations": "",
        "failed_tasks": "",
        "flag": "",
        "note": "",
        **fields,
        "off_protocol": {"on": False, "off": True}.get(fields["conformance"]),
        **{t: cells.get(t) for t in TASKS},
        **{f"{t}_std": std.get(t) for t in TASKS},
        **{f"{t}_n": n.get(t) for t in TASKS},
        **average_columns(cells),
    }


def _wide_key(row: dict[str, Any], methods: dict[tuple[Any, ...], dict[str, Any]]) -> tuple[Any, ...]:
    """The wide row `row` joins: its `WIDE_KEYS`, or — when that row already holds another experiment of this task
    (two experiments whose labels clash) — one of its own, so an experiment is never overwritten."""
    key = values_at(row, WIDE_KEYS)
    taken = methods.get(key, {}).get("fingerprints", {}).get(row["task"])
    return key if taken in (None, row.get("fingerprint")) else (*key, row.get("fingerprint"))


def wide_rows(rows: Sequence[dict[str, Any]], failures: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per method, conformance class and variant (`WIDE_KEYS`); columns = tasks; our rows only. A task
    cell is one experiment's row (`group_rows`), so a wide row never pools two experiments of one task; its
    `task_fingerprints` say which (the Pareto average and the reproduction verdicts read its tasks through them)."""
    methods: dict[tuple[Any, ...], dict[str, Any]] = {}

    def entry_of(key: tuple[Any, ...]) -> dict[str, Any]:
        return methods.setdefault(
            key, {"cells": {}, "std": {}, "n": {}, "accs": {}, "fingerprints": {}, "failed": set(), "deviations": set()}
        )

    for row in rows:
        entry = entry_of(_wide_key(row, methods))
        entry["deviations"].update(filter(None, str(row.get("deviations") or "").split(",")))
        entry["fingerprints"][row["task"]] = row.get("fingerprint")
        entry["full"] = row.get("variant_full") or ""
        if row["test_acc_mean"] is not None:
            entry["cells"][row["task"]] = row["test_acc_mean"]
            entry["std"][row["task"]] = row["test_acc_std"]
            entry["n"][row["task"]] = row["n"]
            entry["accs"][row["task"]] = list(row.get("test_accs") or [])
    for fail in failures:
        entry_of(values_at(fail, WIDE_KEYS))["failed"].add(fail["task"])
    out = []
    for key in sorted(methods, key=lambda k: tuple(str(x) for x in k)):
        entry = methods[key]
        tag = f" ⟨{key[len(WIDE_KEYS)]}⟩" if len(key) > len(WIDE_KEYS) else ""  # a clash split off: its fingerprint
        named = dict(zip(WIDE_KEYS, key))
        out.append(
            wide_row(
                entry["cells"],
                entry["std"],
                entry["n"],
                kind="ours",
                source="ours",
                **named,
                variant_full=entry.get("full", ""),
                deviations=",".join(sorted(entry["deviations"])),
                method=row_label(named) + tag,
                task_fingerprints=dict(entry["fingerprints"]),
                task_accuracies=dict(entry["accs"]),
                # A task with no completed run but a failed/unfinished one shows as ✗, not as blank.
                failed_tasks=",".join(t for t in TASKS if t in entry["failed"] and t not in entry["cells"]),
            )
        )
    return out


def published_wide_rows(published: Sequence[PublishedRow]) -> list[dict[str, Any]]:
    """Published rows in the same shape as `wide_rows`, marked kind=published; averages recomputed."""
    out = []
    for row in published:
        cells = {t: float(v) for t, v in row.scores.items() if isinstance(v, (int, float))}
        out.append(
            wide_row(
                cells,
                {},
                {},
                kind="published",
                source=row.source_label,
                conformance="published",
                protocol=row.protocol,
                attn=row.attn,
                rank_budget=row.rank_budget,
                window=None,
                method=row.model,
                failed_tasks=",".join(t for t, v in row.scores.items() if v == "FAIL"),
                avg_reported=row.avg_reported,
                peak_memory_mb=row.peak_memory_mb,
                flag=row.flag,
                note=row.avg_note,
            )
        )
    return out
