"""The logged `val/loss` and `test/loss` are means over examples, like the record's `test_loss`.

They were means of batch means: with 13 test examples in batches of 8 and 5, Lightning's printed test loss
(1.8584 in a real 500-example run) disagreed with the record's 1.8698 from the same predictions."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from lra_bench.run.module import LRAModule


class Embed(nn.Module):
    """A lookup table drawn from its own generator: the test's premise (the two readings differ) may not depend on
    the global RNG state that the tests run before it leave behind."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(10, 3)
        nn.init.normal_(self.table.weight, generator=torch.Generator().manual_seed(0))

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.table(batch["input_ids"][:, 0])


def batches(n: int, size: int) -> tuple[list[dict[str, torch.Tensor]], torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids, labels = torch.randint(0, 10, (n, 1), generator=g), torch.randint(0, 3, (n,), generator=g)
    return [{"input_ids": ids[i : i + size], "label": labels[i : i + size]} for i in range(0, n, size)], ids, labels


def test_logged_losses_are_means_over_examples_not_over_batches() -> None:
    model = Embed()
    module = LRAModule(model, num_classes=3, optim={"lr": 1e-3}, max_steps=1)
    data, ids, labels = batches(13, 8)  # batches of 8 and 5
    with torch.no_grad():
        per_example = F.cross_entropy(model({"input_ids": ids}), labels, reduction="none")
        batch_means = torch.stack([per_example[:8].mean(), per_example[8:].mean()]).mean()
    assert abs(float(per_example.mean()) - float(batch_means)) > 1e-3  # the two readings differ here
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    loader = DataLoader(data, batch_size=None)
    test = trainer.test(module, loader, verbose=False)[0]
    val = trainer.validate(module, loader, verbose=False)[0]
    torch.testing.assert_close(torch.tensor(test["test/loss"]), per_example.mean(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(torch.tensor(val["val/loss"]), per_example.mean(), rtol=1e-6, atol=1e-6)
