"""Fair tuning: an Optuna search with the same budget and space for every method, then final runs that record it.

1. `python run.py hparams_search=optuna task=listops attn=gpa` — `conf/hparams_search/optuna.yaml`: the Optuna
   sweeper (`hydra_plugins/lra_bench_sweeper/optuna_sweeper.py`) runs `tuning.budget` trials over lr, warm-up and
   dropout, each scored by its best validation accuracy (what `run.py` returns; trials never test). At the end
   `TuningCallback` writes `<sweep dir>/tuning.yaml` — budget, space, sampler seed, trials that completed, the
   chosen values — and prints the command for step 2.
2. `python run.py -m task=listops attn=gpa seed=0,1,2 tuning=tuned tuning.search_dir=<sweep dir>` —
   `conf/tuning/tuned.yaml` reads the chosen values through the `tuned` resolver, so the resolved config (and the
   result record's config and identity) holds them, with `tuning.role=tuned`, the budget and the space.
3. `python -m lra_bench.compare attn=gpa attn=nystrom --in ...` pairs tuned runs; it lets the tuned values differ
   only when both sides were tuned with the same budget and space, and marks tuned / untuned sides.

The `tuned` resolver and the file it reads are the config's (`lra_bench.config.tuned`: it is registered before every
composition); this module writes that file at the end of a search. Light at import (no torch): the callback runs in
Hydra.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from lra_bench.config.tuned import FILENAME, FORMAT, TuningError, load_result
from lra_bench.kit.plain import plain_dict
from lra_bench.record import results

#: the search's own result (best trial, every trial), written by the Optuna sweeper (hydra_plugins/lra_bench_sweeper)
OPTUNA_RESULTS = "optimization_results.yaml"
#: the keys `conf/tuning/tuned.yaml` sets from a search (others the search tuned are passed on the command line)
TUNED_KEYS = ("optim.lr", "optim.warmup_steps", "model.dropout")
#: overrides of the search that the final runs must not repeat
SEARCH_ONLY = ("hparams_search", "tuning.", "hydra.", "seed", "test")


def final_overrides(config: DictConfig, sweep_dir: Path, extra: dict[str, Any]) -> list[str]:
    """The search's own overrides (task, attn, …) minus what only the search needs, plus the tuned ones."""
    task_overrides = list(OmegaConf.select(config, "hydra.overrides.task", default=[]) or [])
    keep = [o for o in task_overrides if not o.lstrip("+~").startswith(SEARCH_ONLY)]
    tuned = ["seed=0,1,2", "tuning=tuned", f"tuning.search_dir={sweep_dir}"]
    return [*keep, *tuned, *(f"{k}={v}" for k, v in extra.items())]


def _completed_trials(sweep_dir: Path) -> int:
    done = 0
    for path in sweep_dir.rglob(results.FILENAME):
        try:
            done += results.read_record(path).get("status") == "completed"
        except (OSError, ValueError):
            continue
    return done


def write_result(config: DictConfig, sweep_dir: Path) -> Path:
    """`<sweep dir>/tuning.yaml` from the Optuna sweeper's result and the search's config."""
    optuna_path = sweep_dir / OPTUNA_RESULTS
    if not optuna_path.is_file():
        raise TuningError(f"{optuna_path}: missing — was it `python run.py hparams_search=optuna ...`, and did it end?")
    found = plain_dict(OmegaConf.load(optuna_path))
    best = dict(found.get("best_params") or {})
    values = {k: best.get(k, OmegaConf.select(config, k)) for k in TUNED_KEYS} | best
    payload = {
        "format": FORMAT,
        "budget": OmegaConf.select(config, "tuning.budget"),
        "trials_completed": _completed_trials(sweep_dir),
        "objective": OmegaConf.select(config, "tuning.objective"),
        "direction": "maximize",
        "sampler": OmegaConf.to_container(config.hydra.sweeper.sampler, resolve=True),
        "sampler_seed": OmegaConf.select(config, "tuning.sampler_seed"),
        "space": OmegaConf.to_container(config.hydra.sweeper.params, resolve=True),
        "best_value": found.get("best_value"),
        "values": values,
        "method": {k: OmegaConf.select(config, f"{k}.name", default=None) for k in ("task", "attn", "selector")},
    }
    path = sweep_dir / FILENAME
    OmegaConf.save(OmegaConf.create(payload), path)
    return path


class TuningCallback(Callback):
    """At the end of an `hparams_search` sweep: write `tuning.yaml` and print the final runs' command."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        path = write_result(config, sweep_dir)
        data = load_result.__wrapped__(str(sweep_dir))  # fresh read (the cache may hold an older search)
        extra = {k: v for k, v in data["values"].items() if k not in TUNED_KEYS}
        command = shlex.join(["python", "run.py", "-m", *final_overrides(config, sweep_dir, extra)])
        chosen = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in data["values"].items())
        print(
            f"[lra-bench] tuning: {data['trials_completed']}/{data['budget']} trials completed; best val_acc "
            f"{data['best_value']} with {chosen}\n[lra-bench] tuning result: {path}\n[lra-bench] final runs: {command}"
        )
