"""`python -m lra_bench.approx` — the Hydra app around the approximation study (config: conf/approx.yaml); the study
itself is `lra_bench.approx.app`."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig


@hydra.main(config_path="../conf", config_name="approx", version_base="1.3")
def main(cfg: DictConfig) -> None:
    # torch and the study's code: only once Hydra has read the command line (`--help` stays fast)
    from lra_bench.approx.app import StudyInputError, run

    try:
        run(cfg, Path(HydraConfig.get().runtime.output_dir))
    except StudyInputError as err:
        print(f"error: {err}", file=sys.stderr)
        if HydraConfig.get().mode == RunMode.RUN:
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
