"""Experiment identity: which runs are the same experiment, and in which keys two experiments differ.

A run's *identity* is a flat `{dotted.key: value}` view of everything that can change its numbers: the resolved
config minus pure logistics (where outputs go, how progress is shown, which logger), plus what the config does
not say about the data (`data.tokens`, the digest of the tokenized splits the model reads — added by the run, see
`lra_bench.run`). Its *fingerprint* is a short hash of that view. The record stores both (`identity`,
`fingerprint`), so the leaderboard and `compare` work from records alone.

Keys in `LOGISTICS` never change a result and are left out; everything else is in, so a new knob is part of the
identity by default (the safe side: two runs that differ in an unknown key are never pooled).

Who uses what: the run stores `identity.json` in its run dir and refuses to resume into another fingerprint
(`lra_bench.run.rundir`); checkpoints carry the identity, and a checkpoint whose `ARCHITECTURE` keys differ
from the run's is refused (`lra_bench.run.checkpoints`); the leaderboard makes one row per
`fingerprint(seed_free(identity))` and labels rows by `differing_keys`.
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
    "threads",  # how many CPU threads compute it (lra_bench.runtime)
    "logger",
    "callbacks.progress_bar",
    "data.num_workers",
    "trainer.accelerator",
    "trainer.devices",
    "trainer.num_nodes",
    "trainer.strategy",
    "trainer.enable_progress_bar",
    "trainer.log_every_n_steps",  # how often metrics are logged
    "callbacks.checkpoint_every_n_steps",  # when last.ckpt is written: a resume is bit-exact whatever the cadence
    "train",  # which stages run, not what a stage computes: an evaluation keeps its checkpoint's fingerprint
    "test",
    "retest",
    "hydra",
    "callbacks.fault",  # the test suite's fault injection (tests/faults.py): a run it breaks never completes
    "pretrained",  # where the pretraining run lies; what it is enters as `pretraining`/`pretraining_fingerprint`
)

#: dotted prefixes in the identity that never change a trained weight or a test prediction: they only measure the
#: model (`diagnostics.*` run on a probe with no gradients and the RNG restored; see `lra_bench.diagnostics.callback`).
#: They stay in the identity (they change what the record's `diagnostics` hold), but runs that differ only here are
#: one experiment for every result a comparison or a leaderboard row reports (`result_view`), as they are for the
#: protocol check (`lra_bench.config.conformance.METHOD_AND_MEASUREMENT`).
MEASUREMENT: tuple[str, ...] = ("diagnostics",)

#: the data's identity, which the config does not hold: the digest of the tokenized splits (`tasks.cache`). What the
#: model reads, not where it lies or when it was written: the same bytes regenerated in another checkout, or copied to
#: a cluster, are the same experiment (a run resumes there and its seeds pool); changed bytes are another.
DATA_KEYS: tuple[str, ...] = ("data.tokens",)
#: the data's identity in records and run dirs before `data.tokens`: the resolved source path and the preprocessing
#: cache key, whose hash covered the source files' paths, sizes and mtimes (`lra_bench.run.rundir` reads them still)
LEGACY_DATA_KEYS: tuple[str, ...] = ("data.source", "data.cache_key")

#: prefixes that fix what a checkpoint's weights mean: another value and the state dict is another model's
ARCHITECTURE: tuple[str, ...] = (
    "task.name",
    "task.seq_len",
    "task.vocab_size",
    "task.num_classes",
    "task.dual",
    "model",
    "attn",
    "selector",
    "pretraining",  # an mlm encoder has one more embedding row (the mask token)
)

#: keys under `ARCHITECTURE` that choose how a component computes, not what its weights mean: they stay in the
#: identity (they move results at fp32 rounding, and `model.kernels` draws its dropout masks from another stream),
#: but a checkpoint trained with one value loads under the other, and a run may choose either and stay on its
#: protocol (`lra_bench.config.conformance`); each training segment records the values it ran with (`run.segments`)
KERNEL_CHOICES: tuple[str, ...] = ("attn.kernel", "selector.kernel", "model.kernels")

#: the value of a kernel choice that every run made before the choice existed computed with. An identity leaves the
#: choice out at this value, so those runs keep their fingerprints: an in-progress run resumes into its folder, and an
#: older seed stays in its leaderboard row. Any other value enters the identity, and is another experiment.
KERNEL_BASELINES: dict[str, str] = {"model.kernels": "eager"}


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
    """The identity part a resolved config gives: every flattened key except logistics and a kernel choice at its
    baseline (`KERNEL_BASELINES`), sorted."""
    flat = flatten(config)
    return {
        k: flat[k]
        for k in sorted(flat)
        if not is_logistics(k) and not (k in KERNEL_BASELINES and flat[k] == KERNEL_BASELINES[k])
    }


#: where a record from before identities puts what it says of itself in its stand-in identity: the keys a resolved
#: config's identity uses for them (a key the config gives wins), so the stand-in groups and compares as an identity
STAND_IN_KEYS = {
    "task": "task.name",
    "attn": "attn.name",
    "selector": "selector.name",
    "protocol": "protocol",
    "rank_budget": "attn.rank_budget",
    "seed": "seed",
}


def identity_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """A record's experiment identity — the one every reader (leaderboard, compare) groups and compares runs by. A
    record from before identities (schema 1, or hand-written) gets a stand-in: its resolved config's identity plus
    what the record says of itself (`STAND_IN_KEYS`). A kernel choice left out at its baseline reads as that value
    (`KERNEL_BASELINES`), so a reader labels an eager run `model.kernels=eager` beside a fused one."""
    identity = record.get("identity")
    if isinstance(identity, Mapping) and identity:
        return {**KERNEL_BASELINES, **identity}
    config = record.get("config")
    stand_in = config_identity(config) if isinstance(config, Mapping) else {}
    for key, dotted in STAND_IN_KEYS.items():
        stand_in.setdefault(dotted, record.get(key))
    return {**KERNEL_BASELINES, **stand_in}


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


def predates_data_tokens(identity: Mapping[str, Any]) -> bool:
    """Whether `identity`'s data part is `LEGACY_DATA_KEYS`, from before `data.tokens`."""
    return not any(k in identity for k in DATA_KEYS) and any(k in identity for k in LEGACY_DATA_KEYS)


def data_differs(stated: Mapping[str, Any], now: Mapping[str, Any]) -> str | None:
    """Why the data a record states (`stated`: its `data` section) is not the data `now` describes, or None when its
    source files (`origin.fingerprint`, their sha256) and its tokenizer are the same. A record that states no sha256
    is never the same: the run dir's take-over of a folder from before `data.tokens` and the upgrade command both ask
    this before they give an old identity today's data part."""
    before = (stated.get("origin") or {}).get("fingerprint")
    after = (now.get("origin") or {}).get("fingerprint")
    if before is None:
        return "its record states no sha256 of its source files"
    if before != after or stated.get("tokenizer_version") != now.get("tokenizer_version"):
        return (
            f"its source files or tokenizer differ now (sha256 {before} → {after}, tokenizer "
            f"{stated.get('tokenizer_version')} → {now.get('tokenizer_version')})"
        )
    return None


def data_identity(tokens: str | None) -> dict[str, Any]:
    """The identity keys of the data: the digest of its tokenized splits (`tasks.cache.tokens_digest`)."""
    return {"data.tokens": tokens}


def run_identity(config: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """A run's whole identity: the config part plus the data part (`data_identity`), sorted by key."""
    return with_data(config_identity(config), data)


def with_data(config_part: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """An identity's config part (`config_identity`) joined with its data part, sorted by key."""
    merged = {**config_part, **data}
    return {k: merged[k] for k in sorted(merged)}


def seed_free(identity: Mapping[str, Any]) -> dict[str, Any]:
    """`identity` without the run seed: `seed` and every `*.seed` that follows it (`attn.seed: ${seed}` in the
    option YAMLs). A component seed set apart from the run seed stays: it is another experiment."""
    seed = identity.get("seed")
    return {
        k: v
        for k, v in identity.items()
        if k != "seed" and not (k.endswith(".seed") and "seed" in identity and v == seed)
    }


def result_view(identity: Mapping[str, Any]) -> dict[str, Any]:
    """`identity` without the `MEASUREMENT` keys: what decides the trained weights and test predictions. Two runs
    whose result views agree are one experiment as far as accuracy and loss go (a peak memory measured over the
    whole run may still include a diagnostics probe)."""
    return {k: v for k, v in identity.items() if not under(k, MEASUREMENT)}


def architecture(identity: Mapping[str, Any]) -> dict[str, Any]:
    """The `ARCHITECTURE` part of an identity (what a checkpoint's state dict depends on)."""
    return {k: v for k, v in identity.items() if under(k, ARCHITECTURE) and not under(k, KERNEL_CHOICES)}


def kernel_choices(identity: Mapping[str, Any]) -> dict[str, Any]:
    """The `KERNEL_CHOICES` part of an identity: how its components compute (what a training segment records). A
    choice the identity leaves out is at its baseline, and reads as that."""
    return {**KERNEL_BASELINES, **{k: v for k, v in identity.items() if under(k, KERNEL_CHOICES)}}


def describe(identity: Mapping[str, Any], keys: Iterable[str], limit: int = 6) -> str:
    """`key=value, …` for `keys` (a missing key shows as `<missing>`), at most `limit` of them then `…`."""
    keys = list(keys)
    parts = [f"{k}={json.dumps(identity[k], default=str) if k in identity else '<missing>'}" for k in keys[:limit]]
    return ", ".join(parts) + (f", … ({len(keys) - limit} more)" if len(keys) > limit else "")
