"""Experiment identity: which runs are the same experiment, and in which keys two experiments differ.

A run's *identity* is a flat `{dotted.key: value}` view of everything that can change its numbers: the resolved
config minus pure logistics (where outputs go, how progress is shown, which logger), plus what the config does
not say about the data (the resolved source and the preprocessing cache key — added by the run, see
`lra_bench.run`). Its *fingerprint* is a short hash of that view. The record stores both (`identity`,
`fingerprint`), so the leaderboard and `compare` work from records alone.

Keys in `LOGISTICS` never change a result and are left out; everything else is in, so a new knob is part of the
identity by default (the safe side: two runs that differ in an unknown key are never pooled).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

#: dotted prefixes that never change a result (outputs, progress, logging, device placement)
LOGISTICS: tuple[str, ...] = (
    "output_root",
    "run_name",
    "ckpt_path",
    "data_dir",  # the data's identity is its resolved source + cache key, not the folder's name
    "cache_dir",
    "print_config",
    "logger",
    "callbacks.progress_bar",
    "data.num_workers",
    "trainer.accelerator",
    "trainer.devices",
    "trainer.num_nodes",
    "trainer.strategy",
    "trainer.enable_progress_bar",
    "hydra",
    "fault",  # test-only fault injection: runs with it are never completed anyway
    "pretrained",  # where the pretraining run lies; what it is enters as `pretraining`/`pretraining_fingerprint`
)


def flatten(node: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` → `{"a.b": 1}`; lists stay values (compared whole)."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def under(key: str, prefixes: Iterable[str]) -> bool:
    """Whether dotted `key` is one of `prefixes` or below one of them."""
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def is_logistics(key: str) -> bool:
    return under(key, LOGISTICS)


def config_identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """The identity part a resolved config gives: every flattened key except logistics, sorted."""
    flat = flatten(config)
    return {k: flat[k] for k in sorted(flat) if not is_logistics(k)}


def fingerprint(identity: Mapping[str, Any]) -> str:
    """A 16-hex-digit hash of the canonical JSON of `identity` (key order irrelevant)."""
    blob = json.dumps(dict(identity), sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def differing_keys(identities: Iterable[Mapping[str, Any]], ignore: Iterable[str] = ()) -> list[str]:
    """Keys (dotted) whose value is not the same in every identity — a key missing from one counts as differing.
    `ignore` holds dotted prefixes left out (e.g. `("seed",)`, or `("attn", "selector", "seed")` for a method
    comparison)."""
    views = [dict(i) for i in identities]
    keys = sorted(set().union(*views)) if views else []
    ignore = tuple(ignore)
    out = []
    for key in keys:
        if under(key, ignore):
            continue
        values = {json.dumps(v[key], sort_keys=True, default=str) if key in v else "<missing>" for v in views}
        if len(values) > 1:
            out.append(key)
    return out
