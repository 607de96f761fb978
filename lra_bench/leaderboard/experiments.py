"""Which records are the same experiment: the leaderboard's rows are experiments, never pools of several.

* A row is one `fingerprint(seed_free(identity))`: runs that differ only in their seed. Runs that differ in anything
  else (4 steps vs 20, an lr sweep, another data source) are separate rows.
* Rows of one cell (protocol, task, attn, selector, landmarks) and one conformance class are labelled by the keys
  they differ in (`variant`, e.g. `optim.lr=0.001`), so two rows of a cell never look alike.
* Conformance (`lra_bench.record.conformance`): `on` (checked, no protocol value changed), `off` (the record lists
  the changed keys in `deviations`) or `unchecked` (a record from before the check, or one that failed before it).
  Only `on` rows are shown beside the published numbers.
* `superseded` only within one fingerprint and seed: the newest completed run wins.

Records from before identities (schema 1, or hand-written ones) get a stand-in identity from what they say (task,
attn, selector, protocol, landmarks, seed and their resolved config), so they still group as they used to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lra_bench.record.identity import config_identity, describe, differing_keys, fingerprint, seed_free

CONFORMANCE = ("on", "off", "unchecked")


def identity_of(record: dict[str, Any]) -> dict[str, Any]:
    identity = record.get("identity")
    if isinstance(identity, dict) and identity:
        return identity
    config = record.get("config")
    stand_in = config_identity(config) if isinstance(config, dict) else {}
    for key in ("task", "attn", "selector", "protocol", "rank_budget", "seed"):
        stand_in[f"record.{key}" if key != "seed" else "seed"] = record.get(key)
    return stand_in


def group_fingerprint(record: dict[str, Any]) -> str:
    """The row a record belongs to: its identity without the seed, hashed."""
    return fingerprint(seed_free(identity_of(record)))


def conformance(record: dict[str, Any]) -> str:
    flag = record.get("off_protocol")
    return "unchecked" if flag is None else ("off" if flag else "on")


def deviation_keys(record: dict[str, Any]) -> list[str]:
    return sorted(record.get("deviations") or {})


def variant_labels(groups: dict[str, dict[str, Any]]) -> dict[str, str]:
    """`{group fingerprint: "key=value, …"}` for groups that share a cell and a conformance class, naming only the
    keys in which they differ ("" when a group is alone)."""
    if len(groups) < 2:
        return dict.fromkeys(groups, "")
    views = {fp: seed_free(identity) for fp, identity in groups.items()}
    keys = differing_keys(views.values())
    return {fp: describe(view, keys) for fp, view in views.items()}


def label_rows(rows: Sequence[dict[str, Any]], cell_keys: Sequence[str]) -> None:
    """Set `variant` on every row (in place) from its cell mates' identities (`row["_identity"]`)."""
    classes: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    for row in rows:
        key = (*(row.get(k) for k in cell_keys), row["conformance"])
        classes.setdefault(key, {})[row["fingerprint"]] = row["_identity"]
    labels: dict[tuple[Any, ...], dict[str, str]] = {key: variant_labels(g) for key, g in classes.items()}
    for row in rows:
        key = (*(row.get(k) for k in cell_keys), row["conformance"])
        row["variant"] = labels[key][row["fingerprint"]]
