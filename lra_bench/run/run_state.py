"""A run dir belongs to one experiment: `identity.json` says which, and nothing of another one goes into it.

The run dir is named after the command's overrides, and some keys are rightly left out of the name (`data_dir`,
`trainer.devices`, …), so two different experiments can meet in one folder. Before anything is written there, a run
compares its fingerprint with the folder's:

* the same fingerprint: resume (`ckpt_path=last`) or start over (`ckpt_path=null`) as asked; a record already
  `completed` is left byte-identical and its summary printed (`retest=true` tests its best checkpoint again);
* another fingerprint: refused with one line naming the differing keys and their values; the folder is untouched.
  (Refused, not sent to a new folder: a folder name that silently changed with `data_dir` would hide the fact that
  the second command is another experiment.) Pass `run_name=<name>` to give it its own folder.

`identity.json` (format `lra-bench/run-identity/1`): `{format, fingerprint, identity, code, created_at}`, written once
by the first run in the folder. Folders from before it existed are compared through their `results.json`'s config
(the config part of the identity only; the data part was not recorded then).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lra_bench.errors import ConfigError
from lra_bench.record import results
from lra_bench.record.builder import now
from lra_bench.record.identity import DATA_KEYS, config_identity, data_identity, differing_keys, under

FILENAME = "identity.json"
FORMAT = "lra-bench/run-identity/1"


def read_identity(output_dir: Path) -> dict[str, Any] | None:
    path = Path(output_dir) / FILENAME
    if not path.exists():
        return None
    stored = json.loads(path.read_text())
    if not isinstance(stored, dict) or stored.get("format") != FORMAT:
        raise ConfigError(f"{path}: not an lra-bench run identity (format {stored.get('format')!r}, want {FORMAT!r})")
    return stored


def write_identity(output_dir: Path, identity: dict[str, Any], fingerprint: str, code: dict[str, Any]) -> None:
    payload = {"format": FORMAT, "fingerprint": fingerprint, "identity": identity, "code": code, "created_at": now()}
    results.write_atomic(Path(output_dir) / FILENAME, payload)


def read_existing_record(output_dir: Path) -> dict[str, Any] | None:
    """The folder's `results.json`, or None when there is none or it cannot be read (then nothing is kept)."""
    path = Path(output_dir) / results.FILENAME
    try:
        return results.read_record(path) if path.exists() else None
    except (OSError, ValueError):
        return None


def _changes(before: dict[str, Any], after: dict[str, Any], keys: list[str], limit: int = 5) -> str:
    def show(view: dict[str, Any], key: str) -> str:
        return json.dumps(view[key], default=str) if key in view else "<unset>"

    parts = [f"{k}: {show(before, k)} → {show(after, k)}" for k in keys[:limit]]
    return "; ".join(parts) + (f"; … ({len(keys) - limit} more)" if len(keys) > limit else "")


def check_same_experiment(output_dir: Path, identity: dict[str, Any], fingerprint: str) -> dict[str, Any] | None:
    """Refuse (`ConfigError`, one line) when `output_dir` holds another experiment. Returns the stored identity
    (None for a new folder)."""
    stored = read_identity(output_dir)
    if stored is not None:
        if stored.get("fingerprint") == fingerprint:
            return stored
        before, keys = stored.get("identity") or {}, differing_keys([stored.get("identity") or {}, identity])
    else:
        record = read_existing_record(output_dir)
        if record is None or not record.get("config"):
            return None
        # a folder from before identity.json: compare what its record holds (the config part)
        before = config_identity(record["config"])
        after = {k: v for k, v in identity.items() if not under(k, DATA_KEYS)}
        keys = differing_keys([before, after])
        if not keys:
            return None
    holder = f"fingerprint {stored.get('fingerprint')}" if stored else "its results.json predates fingerprints"
    raise ConfigError(
        f"run dir {output_dir} holds another experiment ({holder}); this run differs in "
        f"{_changes(before, identity, keys)}. Nothing was changed there: give this run its own folder with "
        "run_name=<name> (or delete that folder to start it over)"
    )


def finished_record(output_dir: Path, fingerprint: str) -> dict[str, Any] | None:
    """The folder's record when it is `completed` for this fingerprint (a record from before fingerprints counts
    when `check_same_experiment` accepted the folder), else None."""
    record = read_existing_record(output_dir)
    if record is None or record.get("status") != "completed":
        return None
    return record if record.get("fingerprint") in (fingerprint, None) else None


def resolved_source(source: str | None) -> str | None:
    """A data source as an absolute path (`kind:path` sources keep their kind), so a relative `data_dir` and a
    moved working directory cannot make two different sources look alike."""
    if not source:
        return None
    if Path(source).exists():
        return str(Path(source).resolve())
    kind, sep, rest = source.partition(":")
    if sep and "/" not in kind and Path(rest).exists():
        return f"{kind}:{Path(rest).resolve()}"
    return source


def data_identity_of(dm: Any) -> dict[str, Any]:
    """The data part of a run's identity, from its prepared data module: source and preprocessing cache key."""
    return data_identity(resolved_source(dm.data_info().get("source")), Path(dm.cache_path).name)
