"""ListOps: the official `listops-1000/basic_{train,val,test}.tsv` (either archive nesting), or our generator.

The files are TSV with a `Source<TAB>Target` header; line ends may be LF or CRLF. A malformed row, a file that is
not UTF-8 and a file with no row after its header are errors that name the file (and the line).

Never over a user's files: with `generate_if_missing=true` (the default; ~100k short trees, about a minute) the
generator (`tasks.generate.listops`, the configured knobs) writes `listops-1000/` only when it is absent or empty —
into a private temp dir first, renamed into place when complete. A `listops-1000/` with one split missing is an
error naming the missing file; one that holds other files, or data we generated with other generator settings,
is an error saying how to generate into a new dir. Nothing is ever deleted.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.base import SPLITS, LRADataModule
from tasks.files import content_digest
from tasks.generate import listops as generator
from tasks.layout import DataSourceError, candidates, find_release_path
from tasks.tokenizers import ListOpsTokenizer, pad_truncate

RELATIVE_DIR = "listops-1000"
GENERATOR_MARKER = "generator.json"  # written beside data we generated: its knobs and generator version
NOT_DATA_IDENTITY = ("gen_workers",)  # generator settings that change how fast, not what, it generates


@dataclass
class ListOpsConfig:
    name: str = "listops"
    max_length: int = 2000  # protocol length: tokens kept
    seq_len: int = 2048  # padded model length (power of two, as the reference harnesses)
    vocab_size: int = ListOpsTokenizer.vocab_size
    num_classes: int = 10
    dual: bool = False
    file_prefix: str = "basic"
    generate_if_missing: bool = True
    # generator knobs (used only when generating)
    gen_num_train: int = 96_000
    gen_num_val: int = 2_000
    gen_num_test: int = 2_000
    gen_min_length: int = 500
    gen_max_length: int = 2000
    gen_max_depth: int = 10
    gen_max_args: int = 10
    gen_seed: int = 0
    gen_workers: int | None = None  # generator processes (None = all cores, capped); the files do not depend on it


def read_listops_tsv(path: Path) -> tuple[list[str], np.ndarray]:
    """Rows of a ListOps TSV as (sources, labels). LF and CRLF both read (csv handles `newline=''`)."""
    sources, labels = [], []
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh, delimiter="\t")
            header = next(reader, None)
            if header != ["Source", "Target"]:
                raise DataSourceError(f"{path}:1: expected the header 'Source<TAB>Target', found {header!r}")
            for line_no, row in enumerate(reader, start=2):
                if not row:
                    continue
                if len(row) != 2:
                    raise DataSourceError(
                        f"{path}:{line_no}: expected 2 tab-separated fields, found {len(row)}: {row!r:.120}"
                    )
                try:
                    label = int(row[1])
                except ValueError:
                    raise DataSourceError(f"{path}:{line_no}: Target {row[1]!r} is not an integer") from None
                if not 0 <= label <= 9:
                    raise DataSourceError(f"{path}:{line_no}: Target {label} is outside 0..9")
                sources.append(row[0])
                labels.append(label)
    except UnicodeDecodeError as err:
        raise DataSourceError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); expected a TSV") from None
    if not labels:
        raise DataSourceError(f"{path}: no examples after the header (expected 'Source<TAB>Target' rows)")
    return sources, np.asarray(labels, dtype=np.int64)


class ListOpsDataModule(LRADataModule):
    name = "listops"
    config = ListOpsConfig

    tokenizer_version = ListOpsTokenizer.version

    def expected_files(self, folder: Path) -> dict[str, Path]:
        return {split: folder / f"{self.cfg['file_prefix']}_{split}.tsv" for split in SPLITS}

    def files(self) -> dict[str, Path] | None:
        folder = find_release_path(self.data_dir, RELATIVE_DIR)
        if folder is None:
            return None
        files = self.expected_files(folder)
        return files if all(p.exists() for p in files.values()) else None

    def generate_command(self, target: Path) -> str:
        return f"python -m tasks.generate.listops --out {target}"

    def generator_knobs(self) -> dict[str, Any]:
        knobs = {k: v for k, v in self.cfg.items() if k.startswith("gen_") and k not in NOT_DATA_IDENTITY}
        return knobs | {"file_prefix": self.cfg["file_prefix"], "generator_version": generator.GENERATOR_VERSION}

    def generated_with(self, folder: Path) -> dict[str, Any] | None:
        """The knobs our generator wrote into `folder` (None: not ours, e.g. the official files)."""
        marker = folder / GENERATOR_MARKER
        return json.loads(marker.read_text()) if marker.exists() else None

    def stale_generated(self) -> bool:
        """Files we generated earlier with other generator knobs (official files carry no marker)."""
        files = self.files()
        if files is None:
            return False
        knobs = self.generated_with(files["train"].parent)
        return knobs is not None and knobs != self.generator_knobs()

    def ensure_source(self) -> None:
        """Use the files in place; generate only into an absent or empty `listops-1000/` (see the module docstring)."""
        c = self.cfg
        folder = find_release_path(self.data_dir, RELATIVE_DIR)
        if folder is not None:
            self.check_layout(folder)
            if self.files() is not None:
                return
        target = folder or Path(self.data_dir).expanduser() / RELATIVE_DIR
        if not c["generate_if_missing"]:
            looked = ", ".join(str(p) for p in candidates(self.data_dir, RELATIVE_DIR))
            raise DataSourceError(
                f"ListOps files {c['file_prefix']}_{{train,val,test}}.tsv not found (looked in {looked}). "
                f"Make them with `{self.generate_command(target)}`, unpack the official lra_release archive "
                f"under data_dir, or set task.generate_if_missing=true."
            )
        self.generate_into(target)

    def check_layout(self, folder: Path) -> None:
        """An existing `listops-1000/`: complete and made with these knobs, or empty; anything else is an error."""
        files = self.expected_files(folder)
        present = [p for p in files.values() if p.exists()]
        if len(present) == len(files):
            knobs = self.generated_with(folder)
            if knobs is not None and knobs != self.generator_knobs():
                wanted = self.generator_knobs()
                changed = ", ".join(f"{k} {knobs.get(k)!r}→{v!r}" for k, v in wanted.items() if knobs.get(k) != v)
                raise DataSourceError(
                    f"{folder} holds ListOps generated with other settings ({changed}); "
                    "it is not regenerated over: set data_dir= to a new or empty dir to generate these, or set the "
                    "task.gen_* knobs back to use it"
                )
            return
        if present:
            missing = [p.name for p in files.values() if not p.exists()]
            raise DataSourceError(
                f"{folder}: {', '.join(missing)} missing (found {', '.join(p.name for p in present)}): an incomplete "
                "ListOps layout; restore the missing file, or set data_dir= to another dir (nothing is generated "
                "over existing files)"
            )
        if any(folder.iterdir()):
            raise DataSourceError(
                f"{folder} holds no {self.cfg['file_prefix']}_{{train,val,test}}.tsv but other files; ListOps is "
                "generated only into an absent or empty dir: set data_dir= to another dir"
            )

    def generate_into(self, target: Path) -> None:
        """Generate into a private temp dir beside `target`, then rename it into place (an interrupted generation
        leaves no partial `listops-1000/`; a concurrent one that finished first wins)."""
        c = self.cfg
        tmp = target.parent / f".{target.name}.{os.getpid()}.tmp"
        started = time.monotonic()
        try:  # from the announcement on: a Ctrl-C the user sends after reading it is answered below
            target.parent.mkdir(parents=True, exist_ok=True)
            print(
                f"[listops] no data under {self.data_dir}: generating {c['gen_num_train']}/{c['gen_num_val']}/"
                f"{c['gen_num_test']} trees into {target} (seed {c['gen_seed']}) — once; later runs reuse them",
                flush=True,
            )
            generator.write_splits(
                tmp,
                c["gen_num_train"],
                c["gen_num_val"],
                c["gen_num_test"],
                task=c["file_prefix"],
                workers=c.get("gen_workers"),
                seed=c["gen_seed"],
                max_depth=c["gen_max_depth"],
                max_args=c["gen_max_args"],
                min_length=c["gen_min_length"],
                max_length=c["gen_max_length"],
            )
            (tmp / GENERATOR_MARKER).write_text(json.dumps(self.generator_knobs(), sort_keys=True) + "\n")
            if target.is_dir() and not any(target.iterdir()):
                target.rmdir()
            try:
                os.replace(tmp, target)
            except OSError:
                if self.files() is None:
                    raise
                print(f"[listops] {target} was generated by another process meanwhile: using it")
        except KeyboardInterrupt:  # Ctrl-C, or run.py's stop signal (a KeyboardInterrupt) before training
            elapsed = dt.timedelta(seconds=round(time.monotonic() - started))
            print(
                f"[listops] generation stopped after {elapsed}: no file was written (the trees made so far are "
                f"dropped, nothing partial is left in {target.parent}); the next run generates them from the start",
                file=sys.stderr,
                flush=True,
            )
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def cache_params(self) -> dict[str, Any]:
        files = self.files() or {}
        stamp = {s: [str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for s, p in files.items()}
        keep = {k: v for k, v in self.cfg.items() if not k.startswith("gen_") and k != "generate_if_missing"}
        return {"task": "listops", "tokenizer": self.tokenizer_version, "files": stamp, **keep}

    def build_split(self, split: str) -> dict[str, np.ndarray]:
        files = self.files()
        if files is None:
            raise DataSourceError(f"ListOps files vanished from {self.data_dir}")
        sources, labels = read_listops_tsv(files[split])
        tok = ListOpsTokenizer()
        ids = np.zeros((len(sources), self.seq_len), dtype=np.int16)
        lengths = np.zeros(len(sources), dtype=np.int32)
        for i, text in enumerate(sources):
            ids[i], lengths[i] = pad_truncate(tok.encode(text), self.max_length, self.seq_len)
        return {"input_ids": ids, "length": lengths, "label": labels}

    def data_info(self) -> dict[str, Any]:
        info = super().data_info()
        files = self.files()
        info["source"] = str(files["train"].parent) if files else None
        info["origin"] = self.origin(files)
        info["split"] = (
            "generated files (train/val/test as generated)"
            if info["origin"] and info["origin"]["kind"] == "generated"
            else "official files (train/val/test as given)"
        )
        return info

    def origin(self, files: dict[str, Path] | None) -> dict[str, Any] | None:
        """Where the data came from, for the record: `generated` (our generator's marker: generator, its knobs and
        seed) or `official` (no marker: the release's files), each with the sha256 fingerprint of the three files'
        bytes — so a record never calls generated trees official, and two runs on the same trees can be told so."""
        if files is None:
            return None
        digest = content_digest([files[s] for s in SPLITS])
        knobs = self.generated_with(files["train"].parent)
        if knobs is None:
            return {"kind": "official", "files": "lra_release listops-1000", "fingerprint": digest}
        return {"kind": "generated", "generator": "tasks.generate.listops", "knobs": knobs, "fingerprint": digest}
