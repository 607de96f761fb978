"""How every checkpoint of a run is written and read: Lightning's `TorchCheckpointIO`, with two changes.

* **Atomic in the checkpoint's own folder.** Lightning 2.6.6 writes through an fsspec transaction: `torch.save`
  into a temp file from `tempfile.mkstemp()` (in `$TMPDIR`), then `shutil.move` onto the final path. That is a
  rename only when `$TMPDIR` and the run dir share a filesystem; across filesystems (a node-local /tmp, a run dir
  on shared storage) `shutil.move` copies into the final path, and a full disk or a kill mid-copy leaves a
  truncated file there. Measured with 2.6.6: a 160 kB checkpoint saved into a 96 kB tmpfs raised ENOSPC and left
  a 96 kB `best-4.ckpt` that does not load. Here the temp file is this process's own file beside the target
  (`tasks.files.unique_tmp`), renamed into place; on any failure it is removed and the target keeps its
  previous content. The whole checkpoint also never has to fit into `$TMPDIR`.
* **A resume reads its file once.** The run validates the checkpoint it resumes from by loading it (weights-only,
  `lra_bench.run.checkpointing.read_checkpoint`) and checks its identity on that same dict; `preload` hands the
  dict to Lightning's `trainer.fit(ckpt_path=…)`, which would otherwise read the file again. The hand-over is
  one-shot and keyed by the resolved path, so any other load (the best checkpoint for the test) reads its file.

Only global rank 0 saves (Lightning's strategy calls `save_checkpoint` on rank 0 only).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO

from tasks.files import make_readable, unique_tmp


class RunCheckpointIO(TorchCheckpointIO):
    def __init__(self) -> None:
        super().__init__()
        self._preloaded: dict[str, dict[str, Any]] = {}

    def preload(self, path: str | Path, checkpoint: dict[str, Any]) -> None:
        """The next `load_checkpoint(path)` returns `checkpoint` (already read and checked) instead of the file."""
        self._preloaded[str(Path(path).resolve())] = checkpoint

    def load_checkpoint(
        self,
        path: Any,
        map_location: Callable | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        checkpoint = self._preloaded.pop(str(Path(path).resolve()), None)
        if checkpoint is not None:
            return checkpoint
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()  # serialised first, as Lightning does: a full disk is then an OSError naming errno
        torch.save(checkpoint, buffer)  # (torch.save onto the file reports it as "unexpected pos" instead)
        tmp = unique_tmp(target)
        try:
            with open(tmp, "wb") as fh:
                fh.write(buffer.getbuffer())
            make_readable(tmp)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)  # a failed write: no partial file, the target keeps its previous content
