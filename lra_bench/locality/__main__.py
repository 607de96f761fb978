"""`python -m lra_bench.locality [windows=[…]] [methods=[…]] [seeds=[…]] [out=DIR] [run.py overrides …]`.

    python -m lra_bench.locality task=listops windows=[1,4,16,64] experiment=demo trainer.max_steps=300

Writes `<out>/locality.json` (every run's row, the summary, the command, the machine), `<out>/locality.md` and
`<out>/locality.png`; the runs live in `<out>/runs`, their output in `<out>/logs`.
"""

from __future__ import annotations

import shlex
import sys
import time
from typing import Any

from lra_bench.locality import report, runs
from lra_bench.locality.settings import Settings, SettingsError, parse, shown
from lra_bench.record.provenance import environment
from lra_bench.record.results import write_atomic
from lra_bench.runtime import uptime


def public_command(argv: list[str]) -> str:
    """The command as a reader would type it: the paths of the machine it ran on (`out=`, `data_dir=`) left out."""
    return " ".join(["python -m lra_bench.locality", *(shlex.quote(a) for a in shown(argv))])


def study(settings: Settings, argv: list[str]) -> dict[str, Any]:
    settings.out.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {
        "schema_version": 1,
        "app": "lra_bench.locality",
        "command": public_command(argv),
        "settings": {
            "windows": list(settings.windows),
            "methods": list(settings.methods),
            "seeds": list(settings.seeds),
            "run_overrides": shown(settings.run_overrides),
        },
        "uptime_before": uptime(),
        "env": environment(),
        "rows": [],
    }
    started = time.perf_counter()
    for arm in runs.arms(settings):
        row = runs.run_arm(arm, settings)
        data["rows"].append(row)
        acc = "—" if row["test_acc"] is None else f"{100 * row['test_acc']:.1f}%"
        print(f"[locality] {arm.label} seed {arm.seed}: {row['status']}, test {acc} ({row['wall_s']} s)", flush=True)
    data["wall_s"] = time.perf_counter() - started
    data["uptime_after"] = uptime()
    data["unequal_keys"] = runs.equal_budget(data["rows"])
    data["summary"] = report.summarize(data["rows"])
    data["plot"] = report.plot(data, settings.out)
    write_atomic(settings.out / "locality.json", data)
    (settings.out / "locality.md").write_text(report.render_markdown(data))
    print(f"wrote {settings.out / 'locality.json'} and {settings.out / 'locality.md'}")
    return data


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        settings = parse(argv)
        study(settings, argv)
    except SettingsError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return runs.EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
