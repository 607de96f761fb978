"""The approximation study as `python -m lra_bench.approx` runs it: its inputs collected, every method evaluated on
them, the summary, `approx.json`, `approx.md` and the plots written (imported once Hydra has read the command line).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from pathlib import Path
from typing import Any

import torch
from hydra import compose
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from lra_bench.approx.capture import Instance, model_instances
from lra_bench.approx.report import plot, render_markdown
from lra_bench.approx.study import build_methods, describe_input, evaluate
from lra_bench.approx.summary import summarize
from lra_bench.approx.synthetic import generate
from lra_bench.config.setup import setup
from lra_bench.kit.plain import plain_dict
from lra_bench.record.provenance import environment
from lra_bench.record.results import write_atomic
from tasks.layout import DataSourceError

log = logging.getLogger("lra_bench.approx")


class StudyInputError(ValueError):
    """Bad input to the study: one line naming the setting, its value and what would be valid (exit 2)."""


def compose_main(overrides: list[str]) -> DictConfig:
    """conf/config.yaml composed with `overrides` (the training config a random model is built from)."""
    setup()
    return compose(config_name="config", overrides=overrides)


def collect_instances(cfg: DictConfig, settings: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """Every source's instances. A source that yields nothing is an error naming the setting — a study whose
    every verdict reads "not measured" must not look like a result."""
    instances: list[Instance] = []
    sources: dict[str, Any] = {}
    if settings.get("sources") and not settings["seeds"]:
        raise StudyInputError(f"approx.seeds={settings['seeds']}: the synthetic sources need at least one seed")
    for name, spec in (settings.get("sources") or {}).items():
        for seed in settings["seeds"]:
            q, k, v = generate(name, spec, int(cfg.n), int(cfg.d), int(seed))
            instances.append(Instance(source=name, name=f"seed{seed}", q=q, k=k, v=v, seed=int(seed)))
        sources[name] = {"synthetic": dict(spec), "n": int(cfg.n), "d": int(cfg.d), "instances": len(settings["seeds"])}
    if cfg.model.enabled or cfg.ckpt:
        try:
            found, info = model_instances(cfg.ckpt, settings["model"], compose_main, int(settings["seeds"][0]))
        except (FileNotFoundError, RuntimeError, KeyError, DataSourceError) as err:
            raise StudyInputError(f"approx.ckpt={cfg.ckpt}: {type(err).__name__}: {err}") from None
        m = settings["model"]
        for name, items in found.items():
            if not items:
                longest = info[name].get("longest_real_tokens")
                raise StudyInputError(
                    f"approx.model.min_len={m['min_len']}: source `{name}` captured no instance — its longest probe "
                    f"sequence has {longest} real tokens (model.max_len={m['max_len']}); choose min_len <= {longest}"
                )
            instances.extend(items)
            sources[name] = {**info[name], "instances": len(items)}
    if not instances:
        raise StudyInputError(
            "approx.sources and approx.model: no input at all — give a synthetic source or model.enabled=true / ckpt"
        )
    return instances, sources


def run(cfg: DictConfig, output_dir: Path) -> dict[str, Any]:
    output_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    settings = plain_dict(OmegaConf.masked_copy(cfg, [str(k) for k in cfg if k != "hydra"]))
    try:
        methods = build_methods(settings, {"seed": int((settings["seeds"] or [0])[0])})
    except ValueError as err:  # e.g. an unknown solve: one line naming the setting
        raise StudyInputError(str(err)) from None
    ms = [int(m) for m in settings["landmarks"]]
    instances, sources = collect_instances(cfg, settings)
    log.info("%d methods × %d landmark counts on %d instances", len(methods), len(ms), len(instances))
    rows: list[dict[str, Any]] = []
    inputs: list[dict[str, Any]] = []
    for i, inst in enumerate(instances):
        t0 = time.perf_counter()
        info, exact = describe_input(inst, ms, float(cfg.rank_tol), bool(cfg.kernel_ranks))
        inputs.append(info)
        seeds = [inst.seed] if inst.seed is not None else [int(s) for s in settings["seeds"]]
        rows += evaluate(inst, methods, ms, seeds, exact)
        where = f"{inst.source}/{inst.name}"
        log.info("[%d/%d] %s n=%d (%.1f s)", i + 1, len(instances), where, info["n"], time.perf_counter() - t0)
    data: dict[str, Any] = {
        "schema_version": 1,
        "app": "lra_bench.approx",
        "command": " ".join(["python -m lra_bench.approx", *HydraConfig.get().overrides.task]),
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "output_dir": str(output_dir),
        "threads": torch.get_num_threads(),
        "env": environment(),
        "settings": settings,
        "sources": sources,
        "methods": [m.__dict__ for m in methods],
        "inputs": inputs,
        "rows": rows,
    }
    data["summary"] = summarize(rows, inputs, settings["claims"])
    data["seconds"] = time.perf_counter() - started
    data["plots"] = plot(data, output_dir) if cfg.plots else []
    write_atomic(output_dir / "approx.json", data)
    (output_dir / "approx.md").write_text(render_markdown(data, h="#"))
    log.info("wrote %s", output_dir / "approx.md")
    return data
