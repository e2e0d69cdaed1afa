"""The one markdown table writer of reports and the UI: every cell whole, and the rows left out counted."""
import polars as pl

from fleetscope.findings.reports import md_table


def test_cells_stay_whole_and_left_out_rows_are_counted():
    df = pl.DataFrame({"subject": ["a|b", "line1\nline2", "c"], "n": [1, None, 3], "ignored": [0, 0, 0]})
    out = md_table(df, ["subject", "n", "not_a_column"], n=2, more="_{n} more in sql_")
    lines = out.strip().split("\n")
    assert lines[0] == "| subject | n |" and lines[1] == "|---|---|"
    assert lines[2] == "| a\\|b | 1 |"              # a pipe does not split the cell
    assert lines[3] == "| line1 line2 |  |"          # a line break does not end the row; null is empty
    assert lines[-1] == "_1 more in sql_"
    assert md_table(df.head(0), ["subject"]) == "_none_\n"
