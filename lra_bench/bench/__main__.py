"""`python -m lra_bench.bench` — the Hydra app around the sweep (config: conf/bench.yaml).

Ctrl-C during the sweep keeps what finished: the configurations measured so far are written and rendered
(bench.json, bench.md, plots; marked `stopped`), the end-of-sweep matmul and the profiles are left out (they did
not run), and the app exits 130 with one line saying where it stopped — not a traceback.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import sys
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from lra_bench.bench.machine import matmul_rate, memory_budget, resolve_device
from lra_bench.bench.profile import auto_labels, profile_spec
from lra_bench.bench.report import plot, render_markdown, summarize_bench
from lra_bench.bench.sweep import SweepStopped, run_sweep, spec_for
from lra_bench.bench.variants import build_variants
from lra_bench.kit.plain import plain_dict
from lra_bench.preflight.digest import check_unchanged, remember_checked
from lra_bench.record.provenance import environment
from lra_bench.record.results import write_atomic

log = logging.getLogger("lra_bench.bench")

MEMORY_NOTE = {
    "cpu": (
        "CPU peak = VmHWM during the mode's calls minus VmRSS just before them, in a process of its own; the "
        "baseline is taken after imports, module construction, input allocation (q, k, v, upstream gradient), "
        "one untimed small-n call, the FlopCounter call, gc and malloc_trim — so it counts what the calls "
        "allocate (activations, autograd buffers, gradients of q, k, v), not the inputs"
    ),
    "cuda": (
        "CUDA peak = torch.cuda.max_memory_allocated during the mode's calls minus memory_allocated just "
        "before them (inputs excluded, caching-allocator reserve not counted)"
    ),
}


def run(cfg: DictConfig, output_dir: Path) -> dict[str, Any]:
    output_dir.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    device = resolve_device(str(cfg.device))
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    threads = torch.get_num_threads()
    variants = build_variants(
        cfg.attns,
        cfg.selectors,
        list(cfg.landmarks),
        cfg.references,
        context={"seed": int(cfg.seed)},
    )
    log.info("%d variants × %d lengths on %s (%d threads)", len(variants), len(cfg.seq_lens), device, threads)
    budget, budget_note = memory_budget(cfg.memory_budget_gib, device)
    load_start = list(os.getloadavg())
    mm_start = matmul_rate(device, cfg.matmul.size, int(cfg.matmul.repeats), int(cfg.matmul.warmup))
    log.info("matmul yardstick: %.1f GFLOP/s", mm_start["flops_per_s"] / 1e9)
    stopped = None
    try:
        rows = run_sweep(variants, cfg, device, threads, budget, mm_start["flops_per_s"], log=log.info)
    except SweepStopped as stop:
        rows, stopped = stop.rows, f"Ctrl-C at {stop.at} ({len(stop.rows)} rows measured before it)"
        if not rows:
            log.info("[bench] stopped by Ctrl-C at %s, before any configuration finished: nothing to report", stop.at)
            raise SystemExit(130) from None
    mm_end = None if stopped else matmul_rate(device, cfg.matmul.size, int(cfg.matmul.repeats), int(cfg.matmul.warmup))
    yardstick = max(mm_start["flops_per_s"], mm_end["flops_per_s"] if mm_end else 0.0)  # rate when least disturbed
    for row in rows:
        if row.get("achieved_flops_per_s"):
            row["rate_fraction"] = row["achieved_flops_per_s"] / yardstick
    settings = plain_dict(OmegaConf.masked_copy(cfg, [str(k) for k in cfg if k != "hydra"]))
    data: dict[str, Any] = {
        "schema_version": 1,
        "app": "lra_bench.bench",
        "command": " ".join(["python -m lra_bench.bench", *HydraConfig.get().overrides.task]),
        "started_at": started,
        "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "output_dir": str(output_dir),
        "device": str(device),
        "threads": threads,
        "env": environment(),
        "settings": settings,
        "matmul": {"start": mm_start, "end": mm_end, "yardstick_flops_per_s": yardstick},
        "load_average_start": load_start,
        "budget_bytes": budget,
        "budget_note": budget_note,
        "memory_note": MEMORY_NOTE[device.type] + ("" if cfg.isolate else " (in-process: approximate)"),
        "stopped": stopped,
        "rows": rows,
    }
    data["summary"] = summarize_bench(rows, settings)
    data["profiles"] = run_profiles(cfg, variants, data, device, threads) if cfg.profile.enabled and not stopped else []
    data["load_average_end"] = list(os.getloadavg())
    data["plots"] = plot(rows, output_dir, tuple(settings["targets"]["slope_range"])) if cfg.plots else []
    write_atomic(output_dir / "bench.json", data)
    (output_dir / "bench.md").write_text(render_markdown(data, h="#"))
    log.info("wrote %s", output_dir / "bench.md")
    if stopped:
        log.info("[bench] stopped by %s: they are in bench.md and bench.json", stopped)
        raise SystemExit(130)
    return data


def run_profiles(cfg: DictConfig, variants: list[Any], data: dict[str, Any], device: Any, threads: int) -> list[Any]:
    """torch.profiler tables for the configurations that miss a target (or `profile.labels`), plus `include`."""
    labels = list(cfg.profile.labels) if cfg.profile.labels not in (None, "auto") else []
    if cfg.profile.labels in (None, "auto"):
        labels = auto_labels(data["summary"], data["rows"], cfg.landmarks[0] if cfg.landmarks else None)
    labels += [lab for lab in cfg.profile.include or [] if lab not in labels]
    n = int(cfg.profile.n or max(int(x) for x in cfg.seq_lens))
    by_label = {v.label: v for v in variants}
    out = []
    for label in labels:
        if label not in by_label:
            continue
        spec = spec_for(by_label[label], n, cfg, device, threads)
        try:
            out.append(profile_spec(spec, str(cfg.profile.mode), int(cfg.profile.steps), int(cfg.profile.top)))
            log.info("profiled %s at n=%d", label, n)
        except Exception as err:  # a profile is a report, never a reason to lose the sweep
            out.append({"label": label, "n": n, "mode": str(cfg.profile.mode), "error": f"{type(err).__name__}: {err}"})
    return out


@hydra.main(config_path="../conf", config_name="bench", version_base="1.3")
def main(cfg: DictConfig) -> None:
    check_unchanged(cfg)  # the config Hydra composed is the one the pre-flight checked, or one line, exit 2
    output_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        run(cfg, output_dir)
    except KeyboardInterrupt:  # outside the sweep (the yardstick, the report): what was written stays
        log.info("[bench] stopped by Ctrl-C before the sweep began or while writing its report (%s)", output_dir)
        raise SystemExit(130) from None


if __name__ == "__main__":
    from lra_bench.bench.checks import check_bench
    from lra_bench.preflight.command_line import preflight

    remember_checked(preflight(sys.argv[1:], config_name="bench", check=check_bench))  # one line, exit 2 on bad input
    main()  # Hydra composes again and runs; the job first compares its config with the checked one
