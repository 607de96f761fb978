"""ListOps: the official `listops-1000/basic_{train,val,test}.tsv` (either archive nesting), or our generator.

The files are TSV with a `Source<TAB>Target` header; line ends may be LF or CRLF. A malformed row is an
error that names the file and the line. With `generate_if_missing=true` (the default) a missing data dir
is filled once by `tasks.generate.listops` with the configured knobs, and the run says so.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.base import SPLITS, LRADataModule
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
    return sources, np.asarray(labels, dtype=np.int64)


class ListOpsDataModule(LRADataModule):
    name = "listops"
    config = ListOpsConfig

    tokenizer_version = ListOpsTokenizer.version

    def files(self) -> dict[str, Path] | None:
        folder = find_release_path(self.data_dir, RELATIVE_DIR)
        if folder is None:
            return None
        files = {split: folder / f"{self.cfg['file_prefix']}_{split}.tsv" for split in SPLITS}
        return files if all(p.exists() for p in files.values()) else None

    def generate_command(self, target: Path) -> str:
        return f"python -m tasks.generate.listops --out {target}"

    def generator_knobs(self) -> dict[str, Any]:
        knobs = {k: v for k, v in self.cfg.items() if k.startswith("gen_") and k not in NOT_DATA_IDENTITY}
        return knobs | {"file_prefix": self.cfg["file_prefix"], "generator_version": generator.GENERATOR_VERSION}

    def stale_generated(self) -> bool:
        """Files we generated earlier with other generator knobs (official files carry no marker)."""
        files = self.files()
        if files is None:
            return False
        marker = files["train"].parent / GENERATOR_MARKER
        return marker.exists() and json.loads(marker.read_text()) != self.generator_knobs()

    def ensure_source(self) -> None:
        files, c = self.files(), self.cfg
        if files is not None:
            if not self.stale_generated():
                return
            target = files["train"].parent
            if not c["generate_if_missing"]:
                print(f"[listops] warning: {target} was generated with other generator settings; using it as is")
                return
            print(f"[listops] {target} was generated with other generator settings: regenerating")
        else:
            target = Path(self.data_dir).expanduser() / RELATIVE_DIR
            if not c["generate_if_missing"]:
                looked = ", ".join(str(p) for p in candidates(self.data_dir, RELATIVE_DIR))
                raise DataSourceError(
                    f"ListOps files {c['file_prefix']}_{{train,val,test}}.tsv not found (looked in {looked}). "
                    f"Make them with `{self.generate_command(target)}`, unpack the official lra_release archive "
                    f"under data_dir, or set task.generate_if_missing=true."
                )
            print(
                f"[listops] no data under {self.data_dir}: generating {c['gen_num_train']}/{c['gen_num_val']}/"
                f"{c['gen_num_test']} trees into {target} (seed {c['gen_seed']}) — once; later runs reuse them"
            )
        generator.write_splits(
            target,
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
        (target / GENERATOR_MARKER).write_text(json.dumps(self.generator_knobs(), sort_keys=True) + "\n")

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
        info["split"] = "official files (train/val/test as given)"
        return info
