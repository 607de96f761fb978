"""The locality baseline beside the methods: per task, how well the best `attn=local` window does.

Miralles-González et al. 2025 ("On the locality bias and results in the Long Range Arena", arXiv 2501.14850) find
that most LRA accuracy comes from short-range dependencies. So wherever local-window runs are present, each protocol's
summary gets one more row: per task, the `attn=local` experiment whose window did best — chosen on mean *validation*
accuracy (ties: the smaller window), its *test* accuracy shown with its window, so the choice among windows does not
select on the numbers it reports. A method that does not clear that row on a task has not shown that it uses more
than `w` tokens of context there. Only runs of one conformance class and pretraining enter one baseline row, so the
on-protocol table never holds an off-protocol window.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from lra_bench.leaderboard.aggregate import wide_row
from lra_bench.leaderboard.published import TASKS

#: the attention whose runs form the baseline
LOCAL = "local"
KIND = "locality"
LABEL = "best local window (attn=local, w chosen on val)"


def _choice(row: dict[str, Any]) -> tuple[float, float]:
    """Sort key of a candidate: the best mean validation accuracy first, then the smaller window."""
    val = row.get("val_acc_mean")
    return (-(val if val is not None else float("-inf")), float(row.get("window") or 0))


def best_local_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One wide-shaped row (the columns of `aggregate.wide_rows`, kind `locality`) per protocol, conformance class and
    pretraining that has local-window experiments: per task the chosen window's test accuracy, its std over seeds,
    seeds (`<task>_n`) and window (`<task>_window`)."""
    groups: dict[tuple[str, str, str], dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row.get("attn") == LOCAL and row.get("test_acc_mean") is not None:
            key = (str(row["protocol"]), str(row["conformance"]), str(row.get("pretraining") or "none"))
            groups[key][row["task"]].append(row)
    out = []
    for (protocol, conformance, pretraining), by_task in sorted(groups.items()):
        chosen = {task: min(candidates, key=_choice) for task, candidates in by_task.items()}
        cells = {task: row["test_acc_mean"] for task, row in chosen.items()}
        deviations = {d for row in chosen.values() for d in str(row.get("deviations") or "").split(",") if d}
        out.append(
            wide_row(
                cells,
                {task: row["test_acc_std"] for task, row in chosen.items()},
                {task: row["n"] for task, row in chosen.items()},
                kind=KIND,
                source="ours",
                protocol=protocol,
                conformance=conformance,
                pretraining=pretraining,
                attn=LOCAL,
                rank_budget=None,
                deviations=",".join(sorted(deviations)),
                method=LABEL + (f" + SPT({pretraining})" if pretraining != "none" else ""),
                **{f"{t}_window": chosen[t]["window"] if t in chosen else None for t in TASKS},
            )
        )
    return out
