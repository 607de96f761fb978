"""The one pipe-table helper every report uses (`lra_bench.kit.markdown.table`): the layout, and free text that
cannot break a row when it is escaped (the leaderboard's run names and failure reasons)."""

from __future__ import annotations

from lra_bench.kit.markdown import table


def test_a_table_is_header_rule_and_one_line_per_row() -> None:
    assert table(["a", "b"], [["1", 2], ["x", None]]) == ["| a | b |", "|---|---|", "| 1 | 2 |", "| x | None |"]


def test_escaped_cells_keep_a_pipe_or_newline_inside_their_cell() -> None:
    assert table(["why"], [["a | b\nc"]], escape=True)[2] == "| a \\| b c |"
    assert table(["why"], [["a | b"]])[2] == "| a | b |"  # unescaped: taken as written (callers that pass markup)
