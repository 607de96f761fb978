"""`<output_root>/<task>/<attn>/latest`: a link to the run of that task and attention started last.

Run folders are named by their overrides, so the one just started is not obvious among many; `latest` always
points at it (`outputs/listops/gpa/latest/curves.png`, `ckpt_path=outputs/listops/gpa/latest/checkpoints/last.ckpt`).
It is a relative symlink, replaced atomically (a new link renamed over the old one), made only for runs in the
usual `<output_root>/<task>/<attn>/<name>` layout (not for sweep jobs, whose sweep dir already groups them), and
`run_name=latest` is refused (`lra_bench.config.validate.check_run_name`) so no run can land in the link itself.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from omegaconf import DictConfig

LINK = "latest"


def point_latest(cfg: DictConfig, output_dir: Path) -> Path | None:
    """Point `<output_root>/<task>/<attn>/latest` at `output_dir`; return the link, or None outside that layout."""
    group = Path(str(cfg.output_root)) / str(cfg.task.name) / str(cfg.attn.name)
    if output_dir.parent.resolve() != group.resolve() or output_dir.name == LINK:
        return None
    link, tmp = group / LINK, group / f".{LINK}-{os.getpid()}"
    try:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        tmp.symlink_to(output_dir.name, target_is_directory=True)
        os.replace(tmp, link)  # atomic: a reader sees the old link or the new one
    except OSError:  # a filesystem without symlinks, or a real folder named `latest`: the run goes on without
        with contextlib.suppress(OSError):
            tmp.unlink()
        return None
    return link
