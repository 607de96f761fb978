"""What the tasks whose data is not in `lra_release` share: Text (IMDB) and Image (CIFAR-10).

Their source is one of: the original archive unpacked under `data_dir`, a `datasets.save_to_disk` folder, or the
Hugging Face dataset (hub or local HF cache). A missing source is one error that lists the local layouts the task
looks for and the three ways to get the data; checking the source is free once the tokenized cache exists (the hub
is then never asked).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from tasks import cache
from tasks.base import SPLITS, LRADataModule
from tasks.sources import MissingSourceError, hf_hint, source_error


class HubOrArchiveTask(LRADataModule):
    """A task read from its original archive, a `save_to_disk` folder or the Hugging Face dataset (a base class:
    no `name`, so not an option itself)."""

    #: how the errors name the data, e.g. "text (IMDB)"
    source_title: ClassVar[str]
    #: the original archive: (dataset name, archive file, where to get it)
    original_archive: ClassVar[tuple[str, str, str]]

    @property
    def disk_path(self) -> Path:
        return Path(self.data_dir).expanduser() / self.cfg["disk_dir"]

    def local_layouts(self) -> list[str]:
        """The local files the task looks for besides the hub, in the order it tries them (for the error)."""
        raise NotImplementedError

    def read_source(self) -> Any:
        """Read (and check) the source; raises the task's `missing_error` when there is none."""
        raise NotImplementedError

    def missing_error(self, problem: str | None = None) -> MissingSourceError:
        dataset, archive, url = self.original_archive
        hf_name = self.cfg["hf_name"]
        return source_error(
            self.source_title,
            [*self.local_layouts(), f"the Hugging Face dataset {hf_name!r} (hub or local HF cache)"],
            archive=(
                f"{dataset} is not in lra_release; get the original {archive} ({url}) "
                f"and run `tar xzf {archive} -C {Path(self.data_dir).expanduser()}`"
            ),
            hf=hf_hint(hf_name, self.disk_path),
            generator=None,
            problem=problem,
        )

    def ensure_source(self) -> None:
        """Cheap when the tokenized cache exists (the hub is then never asked); else read and check the source."""
        if cache.exists(self.cache_path, SPLITS):
            return
        self.read_source()
