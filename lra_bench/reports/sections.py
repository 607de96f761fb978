"""The sections of docs/results.md rendered from their own inputs (hours to rerun, so a full render keeps them):
the self-pretraining studies, the faithful training step, the locality studies. Each sits between two comments
(`markers`) so a render can replace it (`with_section`) or carry it over (`keep_section`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from lra_bench.reports.spt_study import render_markdown as spt_markdown

#: sections rendered from their own inputs, kept by a full render: the self-pretraining studies, the training step,
#: the locality studies
KEPT_SECTIONS = ("spt_study", "train_step", "locality")


def markers(name: str) -> tuple[str, str]:
    """The comments around a section that is rendered apart (it takes hours to rerun, so a full render keeps it)."""
    return f"<!-- {name}: begin -->", f"<!-- {name}: end -->"


def keep_section(text: str, previous: str, name: str) -> str:
    """`text` with the `name` section of `previous` (if it has one) appended."""
    begin, end = markers(name)
    if begin not in previous or end not in previous or begin in text:
        return text
    section = begin + previous.split(begin, 1)[1].split(end, 1)[0] + end + "\n"
    return text.rstrip("\n") + "\n\n" + section


def with_section(text: str, name: str, body: str) -> str:
    """`text` with the `name` section (between its markers) replaced by `body`, or appended."""
    begin, end = markers(name)
    section = f"{begin}\n{body.rstrip()}\n{end}\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        return head + section + rest.split(end, 1)[1].lstrip("\n")
    return text.rstrip("\n") + "\n\n" + section


def _rendered_from(name: str, flag: str) -> str:
    """The note above a study's section: the file and the command it is rendered from."""
    return (
        f"> Rendered from each study's `{name}` by `python -m lra_bench.reports.results_doc {flag} DIR [{flag} DIR …]`."
    )


def spt_body(studies: list[dict[str, Any]]) -> str:
    body = "\n".join(spt_markdown(study, h="##") for study in studies)
    return _rendered_from("spt_study.json", "--spt") + "\n\n" + body


def locality_body(folders: list[Path], img_dir: Path) -> str:
    """The locality studies' pages (`python -m lra_bench.locality`), their plots copied beside the document under
    a name per study folder."""
    from lra_bench.locality.report import render_markdown as locality_markdown  # scipy: slow, only when asked

    parts = []
    for folder in folders:
        study = json.loads((folder / "locality.json").read_text())
        if study.get("plot"):
            name = f"locality-{folder.resolve().name}.png"
            shutil.copy2(folder / study["plot"], img_dir / name)
            study["plot"] = name
        parts.append(locality_markdown(study, h="##", img_dir=img_dir.name))
    return _rendered_from("locality.json", "--locality") + "\n\n" + "\n".join(parts)


#: the step measurements' rows, every run, beside the page (relative to its tables folder)
STEP_CSV = "train_step.csv"


def step_body(runs: list[dict[str, Any]], tables: str) -> str:
    """The training step of `python -m lra_bench.bench.step --json FILE` runs: the first (newest) run's table
    with its conditions, each other run one line (its step / limit per attention); `tables`, the folder the
    CSV of every row went to, is linked."""
    from lra_bench.bench.step import StepTiming, markdown  # torch and Lightning: only for a step section

    lines = [
        "## The faithful training step against the matmul limit",
        "",
        "The protocol's own network, loss, backward and AdamW step (`python -m lra_bench.bench.step`), beside this "
        "machine's fp32 matmul rate measured in the same process (between the steps, since the bench times the "
        "yardstick round-robin with them, twice a round with the second call timed, from ab58871 on); *step / "
        "limit* is the step time over the time its "
        "FLOPs would take at that rate; *whole protocol* projects 5000 steps plus 100 evaluations of 62 batches.",
        "",
    ]
    first, *rest = runs
    rows = [StepTiming(**row) for row in first["rows"]]
    lines += [f"**{first['title']}** — `{first['command']}`", "", *markdown(rows), ""]
    if rest:
        lines += ["Earlier measurements (step / limit, step time; their commands are in the CSV):", ""]
    for run in rest:
        figures = ", ".join(
            f"{r['attn']}{'' if r['precision'] == '32-true' else ' ' + r['precision']} {r['ratio']:.2f}× "
            f"({r['step_s']:.2f} s)"
            for r in run["rows"]
        )
        lines.append(f"- {run['title']}: {figures}")
    lines += ["", f"Every row of every measurement: [`{tables}/{STEP_CSV}`]({tables}/{STEP_CSV})."]
    return "\n".join(lines)


def write_step_csv(runs: list[dict[str, Any]], path: Path) -> None:
    """Every row of every step measurement as CSV, with its run's title and command."""
    import pandas as pd  # only when the CSV is written: `results_doc --help` stays fast

    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"title": run["title"], "command": run["command"], **row} for run in runs for row in run["rows"]]
    pd.DataFrame(rows).to_csv(path, index=False)
