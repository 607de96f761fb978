"""DDP: `trainer=ddp_cpu` (2 processes, gloo) trains end to end and writes one result record, from rank 0.

`ddp_cpu` uses Lightning's `ddp` script launcher: rank 1 is `python run.py <same args> hydra.run.dir=<run dir>`,
so both ranks run the whole job in the same dir (checked below). `ddp_spawn` was rejected: its main process never
sees global_step, the best score or the step timings (the record came out with train_steps=0, val_acc=None).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lra_bench.errors import ConfigError
from lra_bench.record import results
from lra_bench.record.predictions import load_predictions
from tests.conftest import TINY_LISTOPS, compose, run_cli
from tests.oracle import oracle


def test_ddp_script_launcher_is_refused_inside_a_local_multirun() -> None:
    from hydra.core.hydra_config import HydraConfig

    from lra_bench.config.spec import check_launch

    cfg = compose(["trainer=ddp_cpu", "hydra.mode=MULTIRUN"], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    try:
        with pytest.raises(ConfigError, match="re-run the whole sweep"):
            check_launch(cfg)
        check_launch(compose(["trainer=ddp_cpu", "trainer.strategy=ddp_spawn"]))  # fine
        check_launch(compose(["trainer=cpu"]))  # one device: fine
    finally:
        HydraConfig.instance().cfg = None  # type: ignore[assignment]
    check_launch(compose(["trainer=ddp_cpu"]))  # a single run (no Hydra multirun): fine


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ddp_cpu_trains_and_writes_one_record(tmp_path: Path) -> None:
    # attn.pinv_init=per_matrix: the protocol's batch-wide start (the reference code's) couples an example's output
    # to its batch-mates, so a per-rank batch and the oracle's batch would differ at fp32 rounding
    args = [a for a in TINY_LISTOPS if a != "logger=csv"] + ["logger=default", "attn=nystrom", "trainer=ddp_cpu"]
    args.append("attn.pinv_init=per_matrix")
    args.append("task.gen_num_test=15")  # odd: Lightning's DistributedSampler pads the test split to 16
    wandb_env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wandb-dir")}
    proc = run_cli(args, tmp_path, timeout=800, check=False, env=wandb_env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    records = list((tmp_path / "outputs").rglob(results.FILENAME))
    assert len(records) == 1, records  # rank 1 landed in the same run dir
    out = records[0].parent
    assert (out / "train_ddp_process_1.log").exists(), sorted(p.name for p in out.iterdir())  # rank 1's Hydra log
    assert not list(out.glob(".pl_hydra*")) and len(list(out.rglob("config.yaml"))) == 1  # one .hydra/, rank 0's
    record = results.read_record(records[0])
    assert record["status"] == "completed", record["error"]
    m = record["metrics"]
    assert m["train_steps"] == 4 and m["val_acc"] is not None and m["test_acc"] is not None
    assert m["step_time_median_s"] is not None
    assert record["config"]["trainer"]["strategy"] == "ddp" and record["config"]["trainer"]["devices"] == 2
    assert (out / "wandb_id.txt").read_text().strip() == record["run"]["wandb_id"]
    assert len(list(out.rglob("offline-run-*"))) == 1  # W&B from rank 0 only
    assert proc.stdout.count("result record:") == 1  # one summary
    # per-example test outputs gathered from both ranks: each of the 15 test examples once, in split order
    best = out / "checkpoints" / f"best-{m['best_step']}.ckpt"
    labels, preds, losses = oracle(best, tmp_path, args)
    saved = load_predictions(out / "test_predictions.npz")
    assert m["test_examples"] == len(saved.label) == len(labels) == 15
    assert saved.label.tolist() == labels.tolist() and saved.pred.tolist() == preds.tolist()
    assert m["test_acc"] == float((preds == labels).mean())
    assert m["test_loss"] == pytest.approx(float(losses.mean()), rel=1e-6)
