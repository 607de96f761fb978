"""The two sides of a comparison: which records each side holds, and whether the two may be compared at all.

A side is one experiment per task (the same identity for every seed), so its seeds are replicates. Two sides may
differ only in the method (`attn.*`, `selector.*`) and the seed: anything else (lr, steps, data, protocol) would make
the difference partly about that, and is refused with the keys named. Measurement settings (`MEASUREMENT`:
`diagnostics.*`) never change a weight or a prediction, so they may differ, as in the protocol check
(`lra_bench.config.conformance`). Two *tuned* sides may also differ in the values their searches chose, given the
same budget and space (the point of fair tuning); a tuned side against an untuned one is refused unless
`--allow-differ` accepts it knowingly (the report marks which side was tuned, and whether each kept its protocol).

A record whose test accuracy is not a number (NaN, inf) is refused: no statistic can use it, and leaving it out
quietly would change which seeds are paired.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lra_bench.leaderboard.aggregate import canonical_task, find_results, load_records, method_label
from lra_bench.leaderboard.experiments import conformance
from lra_bench.record.identity import MEASUREMENT, differing_keys, identity_of
from lra_bench.record.reader import typed

#: record fields a selector may name without a dot (`attn=gpa`); anything else is a dotted identity key
SHORT_KEYS = ("task", "attn", "selector", "protocol", "seed", "rank_budget")
#: what may differ between the two sides: the method and the seed
METHOD_PREFIXES = ("attn", "selector", "seed")
#: what a search produced for one method (not part of the experiment two tuned methods must share)
TUNING_OUTCOME_KEYS = ("tuning.search_dir", "tuning.best_val_acc")
SPACE_PREFIX = "tuning.space."


class CompareError(ValueError):
    """Bad input or an unfair comparison; the message is one line naming the keys and values."""


@dataclass(frozen=True)
class Tuning:
    """How a tuned side was tuned: its search's budget, the keys it searched, and the values it chose."""

    budget: Any
    values: dict[str, Any]

    def describe(self) -> str:
        chosen = ", ".join(
            f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={_text(v)}" for k, v in self.values.items()
        )
        return f"tuned ({self.budget} trials on the validation split; {chosen})"


def _text(value: Any) -> str:
    """How a config value reads on a command line (None → null, True → true), for selectors and messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def parse_selector(spec: str) -> list[tuple[str, str]]:
    conditions = []
    for part in spec.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise CompareError(
                f"selector {spec!r}: {part!r} is not key=value (e.g. attn=gpa or attn=nystrom,attn.num_landmarks=32)"
            )
        conditions.append((key.strip(), value.strip()))
    return conditions


def _field(record: Mapping[str, Any], identity: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    if key in SHORT_KEYS:
        value = record.get(key)
        return True, canonical_task(value) if key == "task" else value
    return (key in identity), identity.get(key)


def matches(record: Mapping[str, Any], identity: Mapping[str, Any], conditions: Sequence[tuple[str, str]]) -> bool:
    fields = [(_field(record, identity, key), want) for key, want in conditions]
    return all(found and _text(value) == want for (found, value), want in fields)


@dataclass
class Side:
    """One side: `runs[task][seed]` = the record kept for that seed; `notes` = what was left out and why."""

    name: str
    spec: str
    runs: dict[str, dict[Any, dict[str, Any]]]
    notes: list[str] = field(default_factory=list)

    def records(self, task: str) -> list[dict[str, Any]]:
        return list(self.runs.get(task, {}).values())

    @property
    def label(self) -> str:
        labels = {
            method_label(r.get("attn"), r.get("selector"), r.get("rank_budget"), window=r.get("window"))
            for t in self.runs
            for r in self.records(t)
        }
        return labels.pop() if len(labels) == 1 else self.spec

    def tuning(self, task: str) -> Tuning | None:
        """How the side was tuned on `task` (as its runs' identity says), or None when it was not."""
        records = self.records(task)
        identity = identity_of(records[0]) if records else {}
        if identity.get("tuning.role") != "tuned":
            return None
        params = [k[len(SPACE_PREFIX) :] for k in identity if k.startswith(SPACE_PREFIX)]
        return Tuning(identity.get("tuning.budget"), {p: identity.get(p) for p in params})

    def protocol(self, task: str) -> Protocol:
        """The side's conformance on `task`: off when any run is off, unchecked when any is unchecked, else on."""
        classes = {conformance(r) for r in self.records(task)}
        found = next((c for c in ("off", "unchecked", "on") if c in classes), "unchecked")
        deviations = {k: v for record in self.records(task) for k, v in (record.get("deviations") or {}).items()}
        return Protocol(found, dict(sorted(deviations.items())))


@dataclass(frozen=True)
class Protocol:
    """Whether a side's runs on a task kept their protocol's values: `conformance` "on" | "off" | "unchecked"
    (`lra_bench.leaderboard.experiments.conformance`) and the changed values `{key: {"protocol", "run"}}`."""

    conformance: str
    deviations: dict[str, dict[str, Any]]

    def describe(self, skip: Sequence[str] = (), limit: int = 4) -> str:
        """E.g. "OFF-PROTOCOL: trainer.max_steps=6 (protocol 50000), …"; "" when on protocol (or only `skip` keys,
        a tuned side's searched keys, differ)."""
        if self.conformance == "unchecked":
            return "protocol conformance not recorded (an older record)"
        keys = [k for k in self.deviations if k not in skip]
        if self.conformance == "on" or not keys:
            return ""
        shown = ", ".join(
            f"{k}={_text(self.deviations[k].get('run'))} (protocol {_text(self.deviations[k].get('protocol'))})"
            for k in keys[:limit]
        )
        more = f", +{len(keys) - limit} more" if len(keys) > limit else ""
        return f"OFF-PROTOCOL: {shown}{more}"


def _usable(record: Mapping[str, Any], include_evaluated: bool) -> str | None:
    """Why a record is left out, or None when it is compared."""
    status = record.get("status")
    if status != "completed" and not (include_evaluated and status == "evaluated"):
        return f"status {status}"
    if identity_of(record).get("tuning.role") == "trial":
        return "a tuning trial (validation only)"
    if typed(record).metrics.test_acc is None:
        return "no test accuracy"
    return None


def _check_accuracy(name: str, record: Mapping[str, Any]) -> None:
    """Refuse a record whose test accuracy is not a number (see the module)."""
    value: Any = typed(record).metrics.test_acc
    try:
        ok = math.isfinite(float(value)) and 0.0 <= float(value) <= 1.0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise CompareError(
            f"{name}: {record['_path']} records test_acc = {value!r}, not an accuracy in [0, 1] (its test produced no "
            "valid number): re-test that run, or leave it out of the side"
        )


def collect(name: str, spec: str, search_dirs: Sequence[Path], include_evaluated: bool = False) -> Side:
    """The records of one side: a path's records, or the records under `search_dirs` a selector picks."""
    path = Path(spec)
    conditions: list[tuple[str, str]] = []
    if path.exists():
        roots: Sequence[Path] = [path]
    elif "=" in spec:
        conditions = parse_selector(spec)
        if not search_dirs:
            raise CompareError(f"{name}={spec!r} is a selector: give the dirs to search with --in DIR...")
        roots = search_dirs
    else:
        raise CompareError(f"{name}={spec!r}: no such file or directory, and not a selector (key=value[,key=value])")
    records, unreadable = load_records(find_results(roots))
    notes = [f"unreadable: {u['path']} ({u['reason']})" for u in unreadable]
    chosen = [
        (r, _usable(r, include_evaluated)) for r in records if not conditions or matches(r, identity_of(r), conditions)
    ]
    skipped = Counter(reason for _, reason in chosen if reason)
    picked = [r for r, reason in chosen if not reason]
    for record in picked:
        _check_accuracy(name, record)
    notes += [f"left out {n} run(s): {reason}" for reason, n in sorted(skipped.items())]
    if not picked:
        where = ", ".join(str(r) for r in roots)
        hint = _values_hint(records, conditions)
        raise CompareError(f"{name}={spec!r} matches no completed run with a test accuracy under {where}{hint}")
    for task in dict.fromkeys(r["task"] for r in picked):  # before deduplicating seeds: a rerun is one experiment
        _check_one_experiment(name, spec, task, [r for r in picked if r["task"] == task])
    return Side(name, spec, _by_task_and_seed(picked, notes), notes)


def _values_hint(records: Iterable[Mapping[str, Any]], conditions: Sequence[tuple[str, str]]) -> str:
    if not conditions:
        return ""
    key = conditions[0][0]
    values = sorted({_text(_field(r, identity_of(r), key)[1]) for r in records if _field(r, identity_of(r), key)[0]})
    return f" ({key} values there: {', '.join(values)})" if values else f" (no record has a key {key!r})"


def _by_task_and_seed(records: Sequence[dict[str, Any]], notes: list[str]) -> dict[str, dict[Any, dict[str, Any]]]:
    """One record per (task, seed): a seed run twice (the same experiment, checked before) keeps its latest finished
    run, as the leaderboard does."""
    groups: dict[str, dict[Any, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        groups[record["task"]][record.get("seed")].append(record)
    out: dict[str, dict[Any, dict[str, Any]]] = {}
    for task, seeds in groups.items():
        out[task] = {}
        for seed, runs in sorted(seeds.items(), key=lambda kv: str(kv[0])):
            runs.sort(key=lambda r: (str(typed(r).run.finished_at or ""), r["_path"]))
            out[task][seed] = runs[-1]
            notes += [f"superseded by a later run of seed {seed} on {task}: {r['_path']}" for r in runs[:-1]]
    return out


def _values(identities: Sequence[Mapping[str, Any]], key: str) -> str:
    values = sorted({_text(i[key]) if key in i else "<missing>" for i in identities})
    return ", ".join(values[:3]) + (" …" if len(values) > 3 else "")


def seed_following_keys(identities: Sequence[Mapping[str, Any]]) -> list[str]:
    """Keys equal to the run's seed in every identity (`selector.seed: ${seed}`): they differ because the seed
    does, so replicates may differ in them."""
    if not identities or any("seed" not in i for i in identities):
        return []
    keys = set.intersection(*(set(i) for i in identities)) - {"seed"}
    return sorted(k for k in keys if all(i[k] == i["seed"] for i in identities))


def _check_one_experiment(name: str, spec: str, task: str, records: Sequence[Mapping[str, Any]]) -> None:
    identities = [identity_of(r) for r in records]
    keys = differing_keys(identities, ignore=("seed", *seed_following_keys(identities), *MEASUREMENT))
    if keys:
        listed = "; ".join(f"{k} ({_values(identities, k)})" for k in keys[:6])
        more = f"; +{len(keys) - 6} more" if len(keys) > 6 else ""
        raise CompareError(
            f"{name}={spec!r} holds different experiments on {task}: {listed}{more} — narrow it "
            f"(e.g. {spec},{keys[0]}=<value>) so that its runs differ only in the seed"
        )


def method_prefixes(a: Side, b: Side, task: str) -> tuple[str, ...]:
    """What may differ on `task`: the method and seed, plus the tuned values when both sides were tuned."""
    ta, tb = a.tuning(task), b.tuning(task)
    if ta is None or tb is None:
        return METHOD_PREFIXES
    return (*METHOD_PREFIXES, *ta.values, *tb.values, *TUNING_OUTCOME_KEYS)


def check_comparable(a: Side, b: Side, tasks: Sequence[str], allow: Sequence[str] = ()) -> None:
    """Refuse, in one line naming every differing key and its values, sides that differ in more than the method."""
    problems = []
    for task in tasks:
        ida = [identity_of(r) for r in a.records(task)]
        idb = [identity_of(r) for r in b.records(task)]
        keys = differing_keys([*ida, *idb], ignore=(*method_prefixes(a, b, task), *MEASUREMENT, *allow))
        if keys:
            listed = ", ".join(f"{k} ({a.name} {_values(ida, k)}; {b.name} {_values(idb, k)})" for k in keys[:6])
            more = f", +{len(keys) - 6} more" if len(keys) > 6 else ""
            tuned = [side.name for side in (a, b) if side.tuning(task) is not None]
            why = f"{tuned[0]} is tuned and the other side is not; " if len(tuned) == 1 else ""
            problems.append(f"{task}: {why}{listed}{more}")
    if problems:
        raise CompareError(
            f"{a.name} and {b.name} differ in more than the method and seed — {' | '.join(problems)} — only attn.*, "
            "selector.* and seed may differ (and measurement settings such as diagnostics.*; two tuned sides: also "
            "their tuned values, with the same budget and space); --allow-differ KEY accepts a difference knowingly"
        )
