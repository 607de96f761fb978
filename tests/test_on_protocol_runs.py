"""A run of a protocol's own config, with only logistics overridden, is on-protocol (issue: every faithful run was
recorded off-protocol because the run derives `pretraining: "none"` while the protocol's composed config said null).

Two levels, both through the run's own code: every task × attention a protocol's leaderboard lists goes through
the function chain `lra_bench.run.entry.run_stage` and `lra_bench.run.train.train` run before it records (validate →
derive_run_keys → new_record → identify); and real `run.py` processes are read at the record they write once the
run has started.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import compose, start_run, write_listops

PROTOCOLS = ("nystromformer", "skyformer", "lra_original")
#: every override a user may add without leaving the protocol: where data and outputs go, loggers, progress
LOGISTICS = [
    "data_dir=/tmp/lra-data",
    "output_root=/tmp/lra-out",
    "logger=none",
    "run_name=x",
    "callbacks.progress_bar=false",
    "print_config=false",
]
EXTRA_ATTNS = ("linformer", "performer")  # in the published tables the reproductions stand beside


def listed(protocol: str) -> list[tuple[str, str]]:
    """task × attn as the protocol's leaderboard experiment lists them (Path-X included), plus the published
    baselines' attentions."""
    params = compose([f"experiment=leaderboard/{protocol}"], return_hydra_config=True).hydra.sweeper.params  # resolved
    tasks = sorted({*params["task"].split(","), "pathx"})
    attns = [*params["attn"].split(","), *EXTRA_ATTNS]
    return [(t, a) for t in tasks for a in attns]


class PreparedData(SimpleNamespace):
    """What `identify` reads of a prepared data module: its source and tokens' digest."""

    def data_info(self) -> dict[str, Any]:
        return {"source": self.source}


def recorded_conformance(overrides: list[str]) -> dict[str, Any]:
    """The conformance a run of `overrides` records, through the chain `train()` runs before its first step."""
    from lra_bench.config.spec import settle
    from lra_bench.run.rundir import data_identity_of

    spec = settle(compose(overrides), Path("/tmp/lra-out/run"))  # as `run_stage` settles it
    record, data = spec.described, PreparedData(source="/tmp/lra-data/x", tokens="0123456789abcdef")
    record.set_identity(spec.identify(data_identity_of(data)))
    return record.to_dict()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_listed_run_of_a_protocol_is_on_protocol(protocol: str) -> None:
    off = {}
    for task, attn in listed(protocol):
        record = recorded_conformance([f"task={task}", f"attn={attn}", f"protocol={protocol}", *LOGISTICS])
        if record["off_protocol"] is not False:
            off[(task, attn)] = record["deviations"]
    assert not off, f"{protocol}: runs of its own config recorded off-protocol: {off}"


def test_a_changed_protocol_value_is_still_off_protocol() -> None:
    """The guard above must not pass by accepting anything: one changed value is one deviation."""
    record = recorded_conformance(["task=listops", "attn=gpa", "trainer.max_steps=4999", *LOGISTICS])
    assert record["off_protocol"] is True
    assert record["deviations"] == {"trainer.max_steps": {"protocol": 5000, "run": 4999}}


@pytest.mark.parametrize(
    ("protocol", "attn", "knob", "protocol_value", "run_value"),
    [("skyformer", "full", "attn.dropout", 0.1, 0.0), ("nystromformer", "full", "attn.dropout", 0.1, 0.2)],
)
def test_an_attention_knob_the_protocol_sets_is_covered(
    protocol: str, attn: str, knob: str, protocol_value: Any, run_value: Any
) -> None:
    """The reference code's attention settings (`conf/protocol_attn/`) are part of the protocol: a run that changes
    one trains another network and is recorded off-protocol; a knob the protocol does not set stays free."""
    base = ["task=listops", f"attn={attn}", f"protocol={protocol}", *LOGISTICS]
    record = recorded_conformance([*base, f"{knob}={run_value}"])
    assert record["off_protocol"] is True
    assert record["deviations"] == {knob: {"protocol": protocol_value, "run": run_value}}
    free = recorded_conformance(
        ["task=listops", "attn=gpa", f"protocol={protocol}", "attn.num_landmarks=16", *LOGISTICS]
    )
    assert free["off_protocol"] is False


# -- real run.py processes ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def listops_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small ListOps in the official format (the product's generator, official file names and columns)."""
    return write_listops(tmp_path_factory.mktemp("data"))


def record_at_start(args: list[str], out: Path, timeout_s: float = 240) -> tuple[dict[str, Any], str]:
    """Start `python run.py ARGS`, read the record it writes once the run has started (identity and conformance
    filled) and the protocol line it prints just after, stop the run; returns the record and what the run printed."""
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    log_path = out / "run.out"
    out.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = start_run([*args, f"output_root={out}"], env, stdout=log)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                records = list(out.rglob("results.json"))
                record = json.loads(records[0].read_text()) if records else {}
                printed = log_path.read_text()
                if record.get("identity") and ("on protocol" in printed or "OFF protocol" in printed):
                    return record, printed
                assert proc.poll() is None, f"run.py exited {proc.returncode}:\n{log_path.read_text()[-3000:]}"
                assert time.monotonic() < deadline, "no started record in time"
                time.sleep(0.1)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("protocol", "attn"),
    [("nystromformer", a) for a in ("gpa", "nystrom", "full", "linformer", "performer")]
    + [("skyformer", "nystrom"), ("lra_original", "full")],
)
def test_a_real_run_of_the_protocol_records_on_protocol(
    protocol: str, attn: str, listops_dir: Path, tmp_path: Path
) -> None:
    record, printed = record_at_start(
        [
            f"attn={attn}",
            f"protocol={protocol}",
            "task=listops",
            f"data_dir={listops_dir}",
            "logger=none",
            "callbacks.progress_bar=false",
            "print_config=false",
        ],
        tmp_path / "out",
    )
    assert record["status"] == "running"
    assert record["pretraining"] == "none"
    assert (record["off_protocol"], record["deviations"]) == (False, {}), record["deviations"]
    assert f"on protocol {protocol}" in printed


@pytest.mark.slow
def test_a_real_off_protocol_run_says_so_at_its_start(listops_dir: Path, tmp_path: Path) -> None:
    record, printed = record_at_start(
        ["attn=gpa", "task=listops", f"data_dir={listops_dir}", "logger=none", "optim.lr=3e-4"], tmp_path / "out"
    )
    assert record["off_protocol"] is True
    assert record["deviations"] == {"optim.lr": {"protocol": 1.0e-4, "run": 3.0e-4}}
    assert "OFF protocol nystromformer: changes optim.lr" in printed
