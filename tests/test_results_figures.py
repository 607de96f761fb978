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


def test_a_ratio_past_what_its_inputs_support_is_a_bound_not_a_figure() -> None:
    """The one rule (`kit.numbers.ratio_text`): three significant figures; above the limit only the bound; no
    ratio over a noise denominator."""
    from lra_bench.kit.numbers import ratio_text as rule

    assert rule(676682359.81, limit=87.3) == "> 87.3× (worse than Â = 0)"
    assert rule(3.3412, limit=87.3) == "3.34×" and rule(87.3, limit=87.3) == "87.3×"
    assert rule(None) == "not meaningful (denominator below the noise floor)"
    assert rule(None, undefined="floor < 1% of ‖A‖_F") == "not meaningful (floor < 1% of ‖A‖_F)"


def test_the_floor_verdict_bounds_an_exploded_solve_by_the_ratio_of_a_zero_prediction() -> None:
    """An evaluation 1e6 × worse than predicting Â = 0 (a floor of 10% of ‖A‖_F) prints `> 10×`, not `1e+07×`;
    one at 3× the floor prints `3×`."""
    from lra_bench.approx.summary import verdict_floor

    def row(label: str, error: float) -> dict[str, object]:
        return {"status": "ok", "source": "trained", "group": "selector", "label": label, "solve": "stable",
                "target": "softmax", "m": 8, "ey_floor": 0.1, "ey_floor_abs": 0.1, "error_abs": error}  # fmt: skip

    got = verdict_floor([row("kmeans", 0.3), row("leverage", 1e6)], {"labels": ["kmeans", "leverage"]})
    assert "kmeans 3×, leverage > 10× (worse than Â = 0)" in got["verdict"]
    assert [r["limit"] for r in got["rows"]] == [10.0, 10.0]
