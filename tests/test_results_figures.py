"""The report's figures carry no more precision than their inputs support (docs/results.md printed
`676682359.81×`), and a target nobody measured is one clause, not a list of every configuration."""

from __future__ import annotations

from lra_bench.approx.summary import ratio_text
from lra_bench.bench.report import MISSING_NAMED, _verdict


def test_floor_ratios_have_three_significant_figures() -> None:
    assert ratio_text(676682359.81) == "6.77e+08×"
    assert ratio_text(56.9731) == "57×" and ratio_text(1.7234) == "1.72×" and ratio_text(403.43) == "403×"


def test_an_unmeasured_target_is_one_clause() -> None:
    names = [f"method{i}/m=16" for i in range(22)]
    nothing = _verdict("speed-up at n=16384", "≥ 30×", dict.fromkeys(names), lambda x: x >= 30, "{:.1f}×")
    assert nothing["verdict"] == "not measured"
    assert nothing["detail"] == "none of the 22 configurations ran at this length"
    some = _verdict(
        "speed-up at n=8192", "≥ 10×", {**dict.fromkeys(names), "linformer/m=16": 84.4}, lambda x: x >= 10, "{:.1f}×"
    )
    assert some["detail"].endswith("; not measured for 22 configurations (listed in bench.json: `summary.targets`)")
    few = _verdict("t", "≥ 1×", {"a": None, "b": 2.0}, lambda x: x >= 1, "{:.1f}×")
    assert few["detail"] == "met by b (2.0×); not measured: a" and MISSING_NAMED >= 1
