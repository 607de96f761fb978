"""The check's report: `report.json` (everything, machine-readable) and `report.md` (for people), rewritten
atomically after every stage change, so a check stopped at any moment leaves a complete report of what ran.

The ListOps table puts each run beside the published Nyströmformer Table 3 number for its attention, read from
`lra_bench/published.json` (the harness's one copy of published results).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATUSES = ("pending", "running", "passed", "failed", "timeout", "skipped")


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class StageRecord:
    name: str
    title: str
    budget_s: float
    status: str = "pending"
    seconds: float | None = None
    summary: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    log_tail: str = ""


def write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)  # mkstemp makes it private; the report is for anyone who can read the folder
    os.replace(tmp, path)


class Report:
    def __init__(self, out_dir: Path, mode: str, command: str, budget_s: float, stages: list[StageRecord]) -> None:
        self.out_dir = out_dir
        self.data: dict[str, Any] = {
            "schema": 1,
            "mode": mode,
            "command": command,
            "started_at": now(),
            "updated_at": now(),
            "finished": False,
            "budget_s": budget_s,
            "elapsed_s": 0.0,
            "hardware": None,
            "env": {},
            "listops": {"rows": [], "settings": ""},
            "bench": {},
            "notes": [],
        }
        self.stages = {s.name: s for s in stages}

    def stage(self, name: str) -> StageRecord:
        return self.stages[name]

    def save(self, elapsed_s: float) -> None:
        self.data["updated_at"] = now()
        self.data["elapsed_s"] = round(elapsed_s, 1)
        self.data["stages"] = [asdict(s) for s in self.stages.values()]
        write_atomic(self.out_dir / "report.json", json.dumps(self.data, indent=1, sort_keys=False, default=str))
        write_atomic(self.out_dir / "report.md", render(self.data))


def _fmt(value: Any, spec: str = ".2f", none: str = "—") -> str:
    if value is None:
        return none
    try:
        return format(value, spec)
    except (TypeError, ValueError):
        return str(value)


def listops_markdown(listops: dict[str, Any]) -> list[str]:
    rows = listops.get("rows") or []
    out = [
        "| attention | status | steps | best val acc % (step) | test acc % | published test acc % | Δ test − published "
        "| median step ms | peak GPU/RSS MiB | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        published = r.get("published")
        pub = f"{published:.2f} ({r['published_model']})" if published is not None else "— (none published)"
        delta = r["test_acc"] - published if published is not None and r.get("test_acc") is not None else None
        best = f"{_fmt(r.get('val_acc'))} ({_fmt(r.get('best_step'), 'd')})" if r.get("val_acc") is not None else "—"
        out.append(
            f"| `{r['attn']}` | {r['status']} | {_fmt(r.get('steps'), 'd')}/{_fmt(r.get('max_steps'), 'd')} | {best} "
            f"| {_fmt(r.get('test_acc'))} | {pub} | {_fmt(delta, '+.2f')} | {_fmt(r.get('step_ms'), '.1f')} "
            f"| {_fmt(r.get('peak_mib'), '.0f')} | {_fmt(r.get('wall_s'), '.0f')} |"
        )
    if not rows:
        out.append("| (no run reached the table) | | | | | | | | | |")
    return out


def render(data: dict[str, Any]) -> str:
    stages = data.get("stages", [])
    lines = [
        f"# GPU check — {data['mode']} mode",
        "",
        f"- hardware: {data.get('hardware') or 'not read yet'}",
        f"- command: `{data['command']}`",
        f"- started {data['started_at']}, updated {data['updated_at']}, "
        f"{'finished' if data['finished'] else 'NOT finished (partial report)'}; "
        f"{data['elapsed_s']:.0f} s of the {data['budget_s']:.0f} s budget",
        f"- git commit: `{data.get('env', {}).get('git_commit')}`; load average (1/5/15 min) at the start "
        f"{(data.get('load_average') or {}).get('start')}, at the end {(data.get('load_average') or {}).get('end')}",
        "",
        "## Stages",
        "",
        "| stage | status | seconds | budget s | summary |",
        "|---|---|---|---|---|",
    ]
    for s in stages:
        summary = s["summary"].replace("|", "\\|").replace("\n", " ")
        lines.append(
            f"| {s['name']} | **{s['status']}** | {_fmt(s['seconds'], '.1f')} | {s['budget_s']:.0f} | {summary} |"
        )
    listops = data.get("listops") or {}
    lines += ["", "## ListOps, Nyströmformer protocol (published: Xiong et al. 2021, Table 3)", ""]
    lines += listops_markdown(listops)
    if listops.get("settings"):
        lines += ["", listops["settings"]]
    for dtype, bench in (data.get("bench") or {}).items():
        if bench.get("markdown"):
            lines += ["", f"## Attention benchmark on the device, {dtype}", "", bench["markdown"]]
    if (data.get("train_step") or {}).get("markdown"):
        lines += ["", "## The faithful training step against the matmul limit", "", data["train_step"]["markdown"]]
    lines += ["", "## Stage details"]
    for s in stages:
        lines += ["", f"### {s['name']}: {s['title']} — {s['status']}", ""]
        if s["summary"]:
            lines.append(s["summary"])
        for key, value in (s.get("details") or {}).items():
            if key.startswith("_"):
                continue
            text = json.dumps(value, default=str) if not isinstance(value, str) else value
            if "\n" in text:
                lines += ["", f"{key}:", "", "```", text.rstrip(), "```"]
            else:
                lines.append(f"- {key}: {text}")
        if s.get("log_tail") and s["status"] in ("failed", "timeout"):
            lines += ["", "last lines of its output:", "", "```", s["log_tail"].rstrip(), "```"]
    if data.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in data["notes"]]
    return "\n".join(lines) + "\n"
