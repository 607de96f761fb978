"""An independent oracle for a checkpoint's test numbers: a plain forward pass in the test process.

The checkpoint's state dict (weights and buffers: GPA's codebook) is loaded strictly into a freshly built network,
the test split is read from the task's cache in order, and the loss is numpy's log-softmax — no Lightning and none of
the harness's test bookkeeping (`lra_bench.run.recorder`), which is what it checks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tests.conftest import compose


def oracle(ckpt: Path, root: Path, overrides: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(labels, predictions, per-example losses) of `ckpt` on the test split, computed here by hand."""
    from lra_bench.run.build import build_datamodule, build_model

    cfg = compose([*overrides, f"data_dir={root / 'data'}"])
    dm = build_datamodule(cfg)
    dm.setup()
    model = build_model(cfg, dm)
    state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})
    model.eval()
    split = dm.splits["test"]
    logits = []
    with torch.no_grad():
        for start in range(0, len(split), 8):
            batch = dm.collate(split.__getitems__(list(range(start, min(start + 8, len(split))))))
            logits.append(model(batch).double().numpy())
    z = np.concatenate(logits)
    labels = np.asarray(split.table["label"]).astype(np.int64)
    log_softmax = z - z.max(1, keepdims=True) - np.log(np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True))
    return labels, z.argmax(1), -log_softmax[np.arange(len(labels)), labels]
