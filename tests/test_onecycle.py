"""`optim.schedule=onecycle`: the Nyströmformer reference's optimiser schedule (mlpen/Nystromformer@5689313
LRA/code/run_tasks.py:62-74), torch's `OneCycleLR(max_lr=lr, pct_start=warmup/total, anneal_strategy="linear",
total_steps=total)` with its defaults (div_factor 25, final_div_factor 1e4, β1 0.95 → 0.85 → 0.95).

Torch's phases (two-phase, `OneCycleLR.__init__`): phase 1 ends at step `pct_start·total − 1` (= warmup − 1), phase
2 at `total − 1`; within a phase the value is linear in `(step − start) / (end − start)`, phase 2 starting at phase
1's end step. So for lr = 1e-4, warm-up 1000, total 5000:

    step s <= 999:  lr = 4e-6 + (1e-4 − 4e-6)·s/999              β1 = 0.95 − 0.1·s/999
    step s >= 999:  lr = 1e-4 + (4e-10 − 1e-4)·(s − 999)/4000    β1 = 0.85 + 0.1·(s − 999)/4000

"step s" is the value the (0-based) s-th optimizer step uses: Lightning (interval "step") calls
`optimizer.step()` and then `scheduler.step()`, once per optimizer step.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from omegaconf import OmegaConf
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lra_bench.config.validate import validate
from lra_bench.errors import ConfigError
from lra_bench.run.module import LRAModule, adamw_with_schedule
from lra_bench.run.train import check_schedule, warmup_warning
from tests.conftest import TINY_LISTOPS, compose, run_cli

LR, WARMUP, TOTAL = 1e-4, 1000, 5000
OPTIM = {"lr": LR, "betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0.0, "warmup_steps": WARMUP,
         "schedule": "onecycle"}  # fmt: skip

# (step, lr, β1), worked out by hand from the formulas in the module docstring
EXPECTED = [
    (0, 4.0e-6, 0.95),  # lr/25, max_momentum
    (1, 4.0e-6 + 9.6e-5 / 999, 0.95 - 0.1 / 999),  # 4.096096…e-6, 0.949899…
    (500, 4.0e-6 + 9.6e-5 * 500 / 999, 0.95 - 50 / 999),  # 5.204804…e-5, 0.899949…
    (999, 1.0e-4, 0.85),  # the peak: the last warm-up step
    (1000, 9.99750001e-5, 0.850025),  # 1e-4 − 9.99996e-5/4000
    (1001, 9.99500002e-5, 0.85005),  # 1e-4 − 2·9.99996e-5/4000
    (3000, 4.99752001e-5, 0.900025),  # pct 2001/4000 = 0.50025
    (4999, 4.0e-10, 0.95),  # lr/25/1e4 at the last step, back to max_momentum
]


def reference(step: int) -> tuple[float, float]:
    """The two linear phases, written independently of torch."""
    peak_step = WARMUP - 1
    if step <= peak_step:
        frac = step / peak_step
        return LR / 25 + (LR - LR / 25) * frac, 0.95 + (0.85 - 0.95) * frac
    frac = (step - peak_step) / (TOTAL - 1 - peak_step)
    return LR + (LR / 25 / 1e4 - LR) * frac, 0.85 + (0.95 - 0.85) * frac


def build(
    optim: dict[str, Any] | None = None, total: int = TOTAL, param: nn.Parameter | None = None
) -> tuple[nn.Parameter, Any, Any]:
    """A one-parameter AdamW and its scheduler, from the function `configure_optimizers` returns."""
    param = nn.Parameter(torch.zeros(3)) if param is None else param
    out = adamw_with_schedule([param], dict(optim or OPTIM), total)
    scheduler: Any = out["lr_scheduler"]
    assert scheduler["interval"] == "step"
    return param, out["optimizer"], scheduler["scheduler"]


def train(param: nn.Parameter, optimizer: Any, scheduler: Any, steps: int) -> list[tuple[float, float]]:
    """(lr, β1) each of `steps` optimizer steps uses, stepping as Lightning does (optimizer, then scheduler)."""
    seen = []
    for _ in range(steps):
        group = optimizer.param_groups[0]
        seen.append((group["lr"], group["betas"][0]))
        optimizer.zero_grad()
        (param * torch.tensor([1.0, -2.0, 3.0])).sum().backward()
        optimizer.step()
        scheduler.step()
    return seen


def test_the_worked_values_follow_the_formula() -> None:
    """The written-down values and the independent formula agree (a typo in either fails here)."""
    for step, lr, beta1 in EXPECTED:
        assert math.isclose(reference(step)[0], lr, rel_tol=1e-9), step
        assert math.isclose(reference(step)[1], beta1, rel_tol=1e-12), step


def test_lr_and_beta1_are_the_references_at_every_step() -> None:
    param, optimizer, scheduler = build()
    assert isinstance(scheduler, torch.optim.lr_scheduler.OneCycleLR)
    seen = train(param, optimizer, scheduler, TOTAL)
    for step, lr, beta1 in EXPECTED:
        assert math.isclose(seen[step][0], lr, rel_tol=1e-9), (step, seen[step][0], lr)
        assert math.isclose(seen[step][1], beta1, rel_tol=1e-12), (step, seen[step][1], beta1)
    for step, (lr, beta1) in enumerate(seen):  # and every other step
        assert math.isclose(lr, reference(step)[0], rel_tol=1e-9, abs_tol=1e-18), step
        assert math.isclose(beta1, reference(step)[1], rel_tol=1e-12), step
    assert optimizer.param_groups[0]["betas"][1] == 0.999  # β2 stays the config's


def test_adam_uses_the_scheduled_beta1() -> None:
    """The first step's first moment is (1 − β1)·g with β1 = 0.95, not the config's 0.9."""
    param, optimizer, scheduler = build()
    train(param, optimizer, scheduler, 1)
    grad = torch.tensor([1.0, -2.0, 3.0])
    torch.testing.assert_close(optimizer.state[param]["exp_avg"], (1 - 0.95) * grad)


def test_a_resumed_schedule_continues_where_it_stopped() -> None:
    """Lightning's restore order: a fresh `configure_optimizers`, then the optimizer's state, then the scheduler's."""
    total, stop = 50, 17
    optim = {**OPTIM, "warmup_steps": 10}
    param, optimizer, scheduler = build(optim, total)
    straight = train(param, optimizer, scheduler, total)

    param, optimizer, scheduler = build(optim, total)
    first = train(param, optimizer, scheduler, stop)
    buffer = io.BytesIO()
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)
    fresh_param, optimizer, scheduler = build(optim, total, nn.Parameter(param.detach().clone()))
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    assert first + train(fresh_param, optimizer, scheduler, total - stop) == straight


def test_other_schedules_are_unchanged() -> None:
    _, optimizer, scheduler = build({**OPTIM, "schedule": "linear"})
    assert isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR)
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.999)
    assert math.isclose(optimizer.param_groups[0]["lr"], LR / WARMUP)  # (0 + 1) / warmup


def test_no_warm_up_starts_at_the_peak() -> None:
    """warmup_steps=0 is the reference's pct_start=0: no warm-up, the lr and β1 anneal from the first step."""
    param, optimizer, scheduler = build({**OPTIM, "warmup_steps": 0}, 100)
    seen = train(param, optimizer, scheduler, 100)
    assert math.isclose(seen[0][0], LR + (LR / 25 / 1e4 - LR) / 100) and math.isclose(seen[0][1], 0.85 + 0.1 / 100)
    assert math.isclose(seen[99][0], LR / 25 / 1e4, rel_tol=1e-9) and math.isclose(seen[99][1], 0.95)


def test_a_one_step_warm_up_runs_as_none() -> None:
    """Torch cannot run a warm-up phase of one step (it ends at step 0 = its start): warmup 1 runs as warmup 0."""
    one = train(*build({**OPTIM, "warmup_steps": 1}, 100), 100)
    none = train(*build({**OPTIM, "warmup_steps": 0}, 100), 100)
    assert one == none


@pytest.mark.parametrize("warmup, total", [(100, 100), (150, 100), (4, 4)])
def test_a_warm_up_past_the_run_is_the_ramp_cut_at_the_end(warmup: int, total: int) -> None:
    """A run shrunk below its warm-up follows the reference's warm-up ramp (lr/25 → lr, β1 0.95 → 0.85 over
    steps 0 .. warmup − 1) until it stops; the decay phase is never reached."""
    seen = train(*build({**OPTIM, "warmup_steps": warmup}, total), total)
    for step, (lr, beta1) in enumerate(seen):
        share = step / (warmup - 1)
        assert math.isclose(lr, LR / 25 + (LR - LR / 25) * share, rel_tol=1e-9), step
        assert math.isclose(beta1, 0.95 - 0.1 * share, rel_tol=1e-9), step


def test_the_start_checks_accept_a_shrunk_run_and_warn() -> None:
    cfg = OmegaConf.create(
        {
            "optim": {**OPTIM, "warmup_steps": 10},
            "trainer": {"max_steps": 10, "val_check_interval": 2, "limit_val_batches": 1},
            "data": {"batch_size": 2},
            "train": True,
            "test": True,
        }
    )
    dm = SimpleNamespace(name="fake", splits={"train": list(range(8)), "val": [0, 1], "test": [0, 1]})
    check_schedule(cfg, dm)
    assert warmup_warning(cfg) is not None
    cfg.optim.warmup_steps = 9
    check_schedule(cfg, dm)
    assert warmup_warning(cfg) is None


def test_validation_knows_the_option() -> None:
    validate(compose(["optim.schedule=onecycle"]))
    with pytest.raises(ConfigError) as err:
        validate(compose(["optim.schedule=bogus"]))
    assert str(err.value) == "optim.schedule='bogus': expected one of linear, cosine, constant, rsqrt, onecycle"


# -- through Lightning: LRAModule.configure_optimizers, a checkpoint mid-schedule, a resume ---------------------------
class _Pairs(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(4, generator=g), "label": torch.tensor(i % 2)}


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.linear(batch["x"])


class _Seen(pl.Callback):
    def __init__(self) -> None:
        self.seen: dict[int, tuple[float, float]] = {}

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        group = trainer.optimizers[0].param_groups[0]
        self.seen[trainer.global_step] = (group["lr"], group["betas"][0])


def _fit(root: Path, max_steps: int, ckpt_path: str | None = None) -> dict[int, tuple[float, float]]:
    torch.manual_seed(0)
    module = LRAModule(_Net(), 2, {**OPTIM, "warmup_steps": 4}, max_steps=12)
    seen = _Seen()
    saver = pl.callbacks.ModelCheckpoint(dirpath=root, every_n_train_steps=5, save_top_k=-1, save_last=False)
    trainer = pl.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[seen, saver],
        default_root_dir=root,
    )
    trainer.fit(module, DataLoader(_Pairs(), batch_size=8), ckpt_path=ckpt_path)
    return seen.seen


def test_lightning_runs_it_and_a_resume_restores_it(tmp_path: Path) -> None:
    straight = _fit(tmp_path / "a", 12)
    assert sorted(straight) == list(range(12))
    assert straight[0] == pytest.approx((LR / 25, 0.95)) and straight[3] == pytest.approx((LR, 0.85))
    assert straight[11] == pytest.approx((LR / 25 / 1e4, 0.95), rel=1e-9)
    _fit(tmp_path / "b", 5)  # stops at step 5 with a checkpoint
    (ckpt,) = (tmp_path / "b").glob("*step=5*.ckpt")
    resumed = _fit(tmp_path / "b", 12, str(ckpt))
    assert sorted(resumed) == list(range(5, 12))
    assert resumed == {step: straight[step] for step in range(5, 12)}


@pytest.mark.slow
def test_the_cli_runs_a_shrunk_onecycle_run_with_its_warning(tmp_path: Path) -> None:
    base = [*TINY_LISTOPS, "attn=full", "diagnostics.enabled=false", "optim.schedule=onecycle"]
    shrunk = run_cli([*base, "run_name=shrunk", "optim.warmup_steps=4"], tmp_path)  # the warm-up is the whole run
    assert "Traceback" not in shrunk.stderr
    assert "optim.warmup_steps=4 >= trainer.max_steps=4" in shrunk.stdout + shrunk.stderr
    bad = run_cli([*base, "run_name=bad", "optim.warmup_steps=-1"], tmp_path, check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1].startswith("error: optim.warmup_steps=-1")
