"""The `tuned` resolver: `${tuned:<search dir>,optim.lr}` reads the values a finished fair-tuning search chose from its
`tuning.yaml` (`conf/tuning/tuned.yaml` uses it for the final runs).

In the config layer because every composition registers it (`lra_bench.config.setup`); the search and the callback
that writes the file are the sweep's (`lra_bench.sweep.tuning`). Light at import: omegaconf only.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lra_bench.kit.plain import plain_dict

FILENAME = "tuning.yaml"
FORMAT = "lra-bench/tuning/1"


class TuningError(ValueError):
    """A search dir without a usable result; one line naming the dir, the key and what would be valid."""


@lru_cache(maxsize=32)
def load_result(search_dir: str) -> dict[str, Any]:
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
    data = load_result(str(search_dir))
    if key in data.get("values", {}):
        return data["values"][key]
    if key in ("budget", "space", "sampler_seed", "best_value", "objective", "trials_completed"):
        return data[key]
    raise TuningError(
        f"tuned:{key}: the search in {search_dir} recorded no such value (it has: "
        f"{', '.join([*data.get('values', {}), 'budget', 'space', 'sampler_seed', 'best_value'])})"
    )
