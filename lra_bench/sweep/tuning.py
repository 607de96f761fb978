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

Light at import (no torch): the resolver is registered before every composition, the callback runs in Hydra.
"""

from __future__ import annotations

import shlex
from functools import lru_cache
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from lra_bench.kit.plain import plain_dict

FILENAME = "tuning.yaml"
FORMAT = "lra-bench/tuning/1"
#: the search's own result (best trial, every trial), written by the Optuna sweeper (hydra_plugins/lra_bench_sweeper)
OPTUNA_RESULTS = "optimization_results.yaml"
#: the keys `conf/tuning/tuned.yaml` sets from a search (others the search tuned are passed on the command line)
TUNED_KEYS = ("optim.lr", "optim.warmup_steps", "model.dropout")
#: overrides of the search that the final runs must not repeat
SEARCH_ONLY = ("hparams_search", "tuning.", "hydra.", "seed", "test")


class TuningError(ValueError):
    """A search dir without a usable result; one line naming the dir, the key and what would be valid."""


@lru_cache(maxsize=32)
def _load(search_dir: str) -> dict[str, Any]:
    path = Path(search_dir) / FILENAME
    if not path.is_file():
        raise TuningError(
            f"tuning.search_dir={search_dir}: no {FILENAME} there — give the sweep dir of a finished "
            "`python run.py hparams_search=optuna ...` (it writes that file when the search ends)"
        )
    loaded = OmegaConf.load(path)
    data = plain_dict(loaded) if isinstance(loaded, DictConfig) else None
    if data is None or data.get("format") != FORMAT:
        raise TuningError(f"{path}: not a {FORMAT} file")
    return data


def tuned_value(search_dir: str, key: str) -> Any:
    """The `tuned` resolver: `${tuned:<search dir>,optim.lr}` → the value the search chose (or, for a key it kept
    fixed, the value its trials used); `budget`, `space`, `sampler_seed`, `best_value` → the search's own."""
    data = _load(str(search_dir))
    if key in data.get("values", {}):
        return data["values"][key]
    if key in ("budget", "space", "sampler_seed", "best_value", "objective", "trials_completed"):
        return data[key]
    raise TuningError(
        f"tuned:{key}: the search in {search_dir} recorded no such value (it has: "
        f"{', '.join([*data.get('values', {}), 'budget', 'space', 'sampler_seed', 'best_value'])})"
    )


def final_overrides(config: DictConfig, sweep_dir: Path, extra: dict[str, Any]) -> list[str]:
    """The search's own overrides (task, attn, …) minus what only the search needs, plus the tuned ones."""
    task_overrides = list(OmegaConf.select(config, "hydra.overrides.task", default=[]) or [])
    keep = [o for o in task_overrides if not o.lstrip("+~").startswith(SEARCH_ONLY)]
    tuned = ["seed=0,1,2", "tuning=tuned", f"tuning.search_dir={sweep_dir}"]
    return [*keep, *tuned, *(f"{k}={v}" for k, v in extra.items())]


def _completed_trials(sweep_dir: Path) -> int:
    from lra_bench.record import results

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
        data = _load.__wrapped__(str(sweep_dir))  # fresh read (the cache may hold an older search)
        extra = {k: v for k, v in data["values"].items() if k not in TUNED_KEYS}
        command = shlex.join(["python", "run.py", "-m", *final_overrides(config, sweep_dir, extra)])
        chosen = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in data["values"].items())
        print(
            f"[lra-bench] tuning: {data['trials_completed']}/{data['budget']} trials completed; best val_acc "
            f"{data['best_value']} with {chosen}\n[lra-bench] tuning result: {path}\n[lra-bench] final runs: {command}"
        )
