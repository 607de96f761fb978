"""Which records are the same experiment: the leaderboard's rows are experiments, never pools of several.

* A row is one `fingerprint(seed_free(identity))`: runs that differ only in their seed. Runs that differ in anything
  else (4 steps vs 20, an lr sweep, another data source) are separate rows.
* Rows of one cell (protocol, task, attn, selector, landmarks) and one conformance class are labelled by the keys
  they differ in (`variant`, e.g. `optim.lr=0.001`), so two rows of a cell never look alike. A label names at most
  `LABEL_KEYS` keys; a longer one ends in a legend tag (`⟨v-1a2b3c⟩`) whose full list of keys is `variant_full`,
  because two experiments that agree on the first keys shown would otherwise share a label and one of them would
  vanish from every table keyed by it. The tag hashes the full list, so the same variant on two tasks keeps one tag.
* Conformance (`lra_bench.config.conformance`): `on` (checked, no protocol value changed), `off` (the record lists
  the changed keys in `deviations`) or `unchecked` (a record from before the check, or one that failed before it).
  Only `on` rows are shown beside the published numbers.
* `superseded` only within one fingerprint and seed: the newest completed run wins.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from lra_bench.record.identity import describe, differing_keys, fingerprint, identity_of, seed_free

CONFORMANCE = ("on", "off", "unchecked")
#: the mark on every row, label and point of ours that is not known to follow its protocol (tables, plots)
MARKS = {"off": " ⚠ off-protocol", "unchecked": " ⚠ protocol unchecked", "on": "", "published": ""}
#: how many differing keys a variant label names before it defers to its legend tag
LABEL_KEYS = 6


def group_fingerprint(record: dict[str, Any]) -> str:
    """The row a record belongs to: its identity without the seed, hashed."""
    return fingerprint(seed_free(identity_of(record)))


def conformance(record: dict[str, Any]) -> str:
    flag = record.get("off_protocol")
    return "unchecked" if flag is None else ("off" if flag else "on")


def mark(conformance_class: Any) -> str:
    """` ⚠ off-protocol` / ` ⚠ protocol unchecked` / "" — appended to a label wherever a row is shown."""
    return MARKS.get(str(conformance_class), MARKS["unchecked"])


def variant_labels(groups: dict[str, dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """`{group fingerprint: (label, full)}` for groups that share a cell and a conformance class. `full` names every
    key in which they differ ("" when a group is alone); `label` is `full` when it names at most `LABEL_KEYS` keys,
    else the first keys and a legend tag. Labels are unique within the cell (a clash, should one remain, gets the
    fingerprint), so no table keyed by them can merge two experiments."""
    if len(groups) < 2:
        return {fp: ("", "") for fp in groups}
    views = {fp: seed_free(identity) for fp, identity in groups.items()}
    keys = differing_keys(views.values())
    out = {}
    for fp, view in views.items():
        full = describe(view, keys, limit=len(keys))
        tag = "v-" + hashlib.sha256(full.encode()).hexdigest()[:6]
        label = full if len(keys) <= LABEL_KEYS else f"{describe(view, keys, LABEL_KEYS)} ⟨{tag}⟩"
        out[fp] = (label, full)
    counts = Counter(label for label, _ in out.values())
    return {fp: (f"{label} ⟨{fp[:8]}⟩" if counts[label] > 1 else label, full) for fp, (label, full) in out.items()}


def label_rows(rows: Sequence[dict[str, Any]], cell_keys: Sequence[str]) -> None:
    """Set `variant` (unique label) and `variant_full` (every differing key) on every row, in place, from its cell
    mates' identities (`row["_identity"]`)."""
    classes: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    for row in rows:
        key = (*(row.get(k) for k in cell_keys), row["conformance"])
        classes.setdefault(key, {})[row["fingerprint"]] = row["_identity"]
    labels = {key: variant_labels(g) for key, g in classes.items()}
    for row in rows:
        key = (*(row.get(k) for k in cell_keys), row["conformance"])
        row["variant"], row["variant_full"] = labels[key][row["fingerprint"]]


def short_variant(variant: str | None) -> str:
    """A variant label short enough for a plot legend or a terminal cell: its legend tag (`⟨v-1a2b3c⟩`, spelled out
    in `leaderboard.md`'s variant legend) when it has one, else the label itself."""
    if not variant:
        return ""
    tag = re.search(r"⟨[^⟩]+⟩$", variant)
    return tag.group(0) if tag else variant
