import polars as pl
import pytest

from fleetscope.schemas import TABLES
from fleetscope.traces import analyze_capture, read_trace
from tests.traces.conftest import real


@pytest.mark.parametrize("prefix", ["nccl_parser_config", "cpu_only", "amd_trace"])
def test_analyze_capture_tables_validate(prefix):
    ev = read_trace(real(prefix), "cap").events
    out = analyze_capture(ev, job_id="j")
    for name, df in out.items():
        TABLES[name].validate(df)
    assert out["replays"].height >= 1 and out["graph_tasks"].height > 0
    assert set(out["whatif"]["scenario"].to_list()) == {"gemm_2x", "attention_1.5x", "no_sync"}
    if prefix == "cpu_only":  # no GPU: no GPU-idle verdict for a CPU-only rank
        assert out["anomaly_verdicts"].filter(pl.col("detector") == "traces.gpu_idle").height == 0
    with pytest.raises(ValueError):
        analyze_capture(ev.head(0))
