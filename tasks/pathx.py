"""Path-X (LRA): Pathfinder at 128×128 = 16,384 pixel tokens, `pathfinder128/curv_contour_length_14`.

Everything is the Pathfinder task (`tasks.pathfinder`) with other defaults. The release has two `pathfinder128`
copies (`lra_release/pathfinder128` and `lra_release/lra_release/pathfinder128`; LRA issue #38 asks which is
right; the thread gives no answer): both are accepted. `folder: auto` takes the deepest copy found, i.e. the inner
`lra_release/lra_release/pathfinder128` that S4's setup instructions move into place (S4 reports 96% on Path-X),
and `data_info.copies_found` lists every copy so a run says which one it read; set `folder:` to choose the other.
Splits as Pathfinder's (`split: lra_original` is LRA's TFDS `hard[:80%]` / `[80%:90%]` / `[90%:]` of
`Pathfinder128`, whose keys and salt are those of the 32 px builder). `generate_if_missing` is false: 200,000
images at 128 px take ~1.7 CPU-hours with our generator, so it runs only when asked
(`task.generate_if_missing=true`, or the command in the error message).
"""

from __future__ import annotations

from dataclasses import dataclass

from tasks.pathfinder import PathfinderConfig, PathfinderDataModule


@dataclass
class PathXConfig(PathfinderConfig):
    name: str = "pathx"
    resolution: int = 128
    max_length: int = 128 * 128
    seq_len: int = 128 * 128
    generate_if_missing: bool = False


class PathXDataModule(PathfinderDataModule):
    """Path-X: the Pathfinder data module at 128 px."""

    name = "pathx"
    config = PathXConfig
