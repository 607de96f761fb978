"""`python -m lra_bench.upgrade_identity ROOT [--data-dir DIR] [--dry-run]`: give every run under ROOT whose identity
predates `data.tokens` the data identity runs have today, after checking that the data is the same.

Until 2026-12 a run's identity named its data by `data.source` (a resolved path) and `data.cache_key` (a hash that
covers the source files' mtimes), so the same bytes regenerated in a fresh checkout were another experiment: such a
record's seeds do not pool with today's runs in the leaderboard, and `compare` refuses to set them side by side. For
each such record this command prepares the data its config names (from `--data-dir`, default: the record's own),
requires the source files' sha256 and the tokenizer to be the ones the record states (`data.origin.fingerprint`,
`data.tokenizer_version`), and only then replaces the two legacy keys by the prepared data's `data.tokens`, with the
fingerprint that follows, in `results.json` and `identity.json` alike; `identity.json` keeps the old fingerprint as
`migrated_from`. A record without a source fingerprint, or whose data differs now, is left as it is and listed.
Exit 1 when any record was left so, 0 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from lra_bench.record import results
from lra_bench.record.identity import LEGACY_DATA_KEYS, data_differs, fingerprint, predates_data_tokens
from lra_bench.run import rundir
from lra_bench.run.build import build_datamodule


def tokens_for(record: dict[str, Any], data_dir: str | None) -> tuple[str | None, str]:
    """The `data.tokens` of the data `record` names, prepared now — or None and why, when the source files or the
    tokenizer are not the ones the record states."""
    cfg = OmegaConf.create(record["config"])
    if data_dir is not None:
        cfg.data_dir, cfg.cache_dir = data_dir, str(Path(data_dir) / "cache")
    dm = build_datamodule(cfg)
    dm.prepare_data()
    stated = record.get("data") or {}
    why = data_differs(stated, dm.data_info())
    if why is not None:
        return None, why
    return dm.tokens, f"source files sha256 {stated['origin']['fingerprint']}"


def upgrade(folder: Path, data_dir: str | None, dry_run: bool) -> tuple[bool, str]:
    """Upgrade the run in `folder` (its `results.json` and `identity.json`); (upgraded, what happened)."""
    record = results.read_record(folder / results.FILENAME)
    identity = dict(record.get("identity") or {})
    if not predates_data_tokens(identity):
        return False, "already current"
    tokens, why = tokens_for(record, data_dir)
    if tokens is None:
        return False, f"left as it is: {why}"
    new = {k: v for k, v in identity.items() if k not in LEGACY_DATA_KEYS} | {"data.tokens": tokens}
    new = {k: new[k] for k in sorted(new)}
    old_fp, new_fp = record.get("fingerprint"), fingerprint(new)
    if not dry_run:
        stored = rundir.read_identity(folder)
        if stored is not None:  # as it was (format, code, created_at), renewed
            renewed = {**stored, "fingerprint": new_fp, "identity": new, "migrated_from": old_fp}
            results.write_atomic(folder / rundir.FILENAME, renewed)
        results.write_atomic(folder / results.FILENAME, {**record, "identity": new, "fingerprint": new_fp})
    return True, f"{old_fp} → {new_fp} (data.tokens {tokens}; {why})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lra_bench.upgrade_identity", description=__doc__.split("\n")[0])
    parser.add_argument("root", type=Path, help="a folder of runs (searched for results.json at any depth)")
    parser.add_argument("--data-dir", help="where the runs' data lies now (default: each record's data_dir)")
    parser.add_argument("--dry-run", action="store_true", help="say what would change; write nothing")
    args = parser.parse_args(argv)
    folders = sorted(p.parent for p in args.root.rglob(results.FILENAME))
    if not folders:
        print(f"error: no {results.FILENAME} under {args.root}", file=sys.stderr)
        return 2
    left = 0
    for folder in folders:
        done, what = upgrade(folder, args.data_dir, args.dry_run)
        left += what.startswith("left")
        print(f"{folder}: {'upgraded ' if done else ''}{what}")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
