"""`python -m lra_bench.compare` and the protocol: off-protocol runs are said to be, and measurement settings
(`diagnostics.*`) neither split a side nor make two sides incomparable — as in the protocol check
(`lra_bench.config.conformance`). Records are written by the compare tests' helper (`write_run`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lra_bench.config.conformance import METHOD_AND_MEASUREMENT
from lra_bench.record.identity import MEASUREMENT, result_view, under
from tests.test_compare import compare, planted, write_run

SHORT = {"trainer.max_steps": {"protocol": 5000, "run": 6}}


def test_off_protocol_runs_are_labelled_off_protocol(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(60)
    for seed in range(2):
        a, b = planted(rng, 0.4, 0.4)
        for name, attn, correct in (("a", "gpa", a), ("b", "nystrom", b)):
            write_run(tmp_path / f"{name}{seed}", attn=attn, seed=seed, correct=correct,
                      overrides=("trainer.max_steps=6",), off_protocol=True, deviations=SHORT)  # fmt: skip
    out = tmp_path / "c.json"
    code, stdout, stderr = compare(capsys, "attn=gpa", "attn=nystrom", "--in", str(tmp_path), "--json", str(out))
    assert code == 0, stderr
    header = stdout.split("Same experiment")[0]
    assert "the protocol's values" not in header
    assert header.count("untuned, OFF-PROTOCOL: trainer.max_steps=6 (protocol 5000)") == 2
    assert "untuned (off-protocol) / untuned (off-protocol)" in stdout
    protocol = json.loads(out.read_text())["tasks"][0]["protocol"]
    assert protocol["A"] == {"conformance": "off", "deviations": SHORT}


def test_on_protocol_and_unchecked_runs_say_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = planted(np.random.default_rng(61), 0.4, 0.4)
    write_run(tmp_path / "a", attn="gpa", seed=0, correct=a)
    write_run(tmp_path / "b", attn="nystrom", seed=0, correct=b, off_protocol=None)
    code, stdout, _ = compare(capsys, str(tmp_path / "a"), str(tmp_path / "b"))
    assert code == 0
    assert "untuned (the protocol's values)" in stdout
    assert "untuned, protocol conformance not recorded (an older record)" in stdout


def test_diagnostics_settings_never_split_a_side_nor_refuse(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A's seeds probe at different cadences and B runs no diagnostics: one experiment each, and comparable."""
    rng = np.random.default_rng(62)
    for seed in range(3):
        a, b = planted(rng, 0.4, 0.4)
        write_run(tmp_path / f"a{seed}", attn="gpa", seed=seed, correct=a,
                  overrides=(f"diagnostics.every_n_validations={seed + 1}",))  # fmt: skip
        write_run(tmp_path / f"b{seed}", attn="nystrom", seed=seed, correct=b, overrides=("diagnostics.enabled=false",))
    code, stdout, stderr = compare(capsys, "attn=gpa", "attn=nystrom", "--in", str(tmp_path))
    assert code == 0, stderr
    assert "the runs differ in diagnostics.enabled, diagnostics.every_n_validations" in stdout
    code, _, stderr = compare(capsys, "attn=gpa", "attn=nystrom", "--in", str(tmp_path), "--allow-differ", "x")
    assert code == 0, stderr


def test_measurement_keys_are_the_protocol_checks() -> None:
    """The shared definition: every MEASUREMENT prefix is one the protocol check ignores, and `result_view` drops
    exactly those keys."""
    assert all(under(m, METHOD_AND_MEASUREMENT) for m in MEASUREMENT)
    identity = {"diagnostics.enabled": True, "diagnostics.max_len": 1024, "optim.lr": 1e-4, "seed": 0}
    assert result_view(identity) == {"optim.lr": 1e-4, "seed": 0}
