import polars as pl
import pytest

from fleetscope.tables import TABLES
from fleetscope.traces import analyze_capture, read_trace
from tests.traces.conftest import real


@pytest.mark.parametrize("prefix", ["nccl_parser_config", "cpu_only", "amd_trace"])
def test_analyze_capture_tables_validate(prefix):
    ev = read_trace(real(prefix), "cap").events
    out = analyze_capture(ev, job_id="j")
    for name, df in out.tables.items():
        TABLES[name].validate(df)
    TABLES["anomaly_verdicts"].validate(out.verdicts)
    assert out["replays"].height >= 1 and out["graph_tasks"].height > 0
    assert set(out["whatif"]["scenario"].to_list()) == {"gemm_2x", "attention_1.5x", "no_sync"}
    if prefix == "cpu_only":  # no GPU: no GPU-idle verdict for a CPU-only rank
        assert out["anomaly_verdicts"].filter(pl.col("detector") == "traces.gpu_idle").height == 0
    empty = analyze_capture(ev.head(0))  # nothing to analyse: no tables, and a note that says so
    assert not empty.tables and empty.verdicts.height == 0 and "no profiler trace events" in empty.notes[0]
