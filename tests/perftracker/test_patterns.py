"""Pattern formulas (PerfTracker 4.2, NOTES.md): beta, mu, sigma, Algorithm 1, trace-derived fallbacks."""
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from fleetscope.perftracker.patterns import PatternConfig, PatternError, behavior_patterns, op_patterns

REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "real"
MS = 1_000_000
T0 = 1_700_000_000_000_000_000


def _events(rows):
    """rows: (cat, name, ts_ms, dur_ms, is_comm, msg_bytes)"""
    df = pl.DataFrame(rows, schema={"cat": pl.Utf8, "name": pl.Utf8, "ts": pl.Float64, "dur": pl.Float64, "is_comm": pl.Boolean,
                                    "msg_bytes": pl.Int64}, orient="row")
    return df.select(
        rank=pl.lit(0, pl.Int32), capture_id=pl.lit("cap"), cat="cat", name="name", pid=pl.lit("1"),
        tid=pl.when(pl.col("cat") == "python_function").then(pl.lit("1")).otherwise(pl.lit("7")),
        ts_ns=(T0 + pl.col("ts") * MS).cast(pl.Int64), dur_ns=(pl.col("dur") * MS).cast(pl.Int64),
        is_comm="is_comm", msg_bytes="msg_bytes", event_id=pl.int_range(pl.len(), dtype=pl.Int64),
    ).with_columns(end_ns=pl.col("ts_ns") + pl.col("dur_ns"))


def _hw(util_pct=None, nvlink=None, period_ms=10, n=100):
    ts = T0 + np.arange(n) * period_ms * MS
    d = {"ts_ns": ts, "host": ["h0"] * n, "gpu": ["h0/gpu0"] * n}
    if util_pct is not None:
        d.update(util_gpu_pct=util_pct, sm_clock_mhz=np.full(n, 1980.0), sm_clock_max_mhz=np.full(n, 1980.0))
    if nvlink is not None:
        d.update(nvlink_tx_bps=nvlink, nvlink_rx_bps=np.zeros(n), nic_tx_bps=np.zeros(n), nic_rx_bps=np.zeros(n))
    return pl.DataFrame(d)


WORKERS = pl.DataFrame({"rank": [0], "host": ["h0"], "gpu": ["h0/gpu0"]}, schema_overrides={"rank": pl.Int32})


def test_beta_mu_sigma_from_hw_samples():
    ev = _events([("kernel", "gemm", 0, 100, False, None), ("kernel", "gemm", 200, 100, False, None)])
    util = np.zeros(100)
    util[0:10] = 80.0   # during the first execution
    util[20:30] = 40.0  # during the second
    pats = behavior_patterns(ev, hw=_hw(util_pct=util), workers=WORKERS, window=(T0, T0 + 1000 * MS))
    r = pats.row(0, named=True)
    d = np.array([100.0, 100.0])
    u = np.array([0.8, 0.4])
    mu = (d * u).sum() / d.sum()
    assert r["beta"] == pytest.approx(d.sum() / 1000.0)
    assert r["mu"] == pytest.approx(mu)
    assert r["sigma"] == pytest.approx(np.sqrt((d * (u - mu) ** 2).sum() / d.sum()))
    assert (r["mu_source"], r["resource"], r["n_exec"]) == ("hw_alg1", "sm", 2)


def test_sm_utilization_counts_the_clock():
    ev = _events([("kernel", "gemm", 0, 100, False, None)])
    hw = _hw(util_pct=np.full(100, 90.0)).with_columns(sm_clock_mhz=pl.lit(990.0))  # half clock: throttled
    r = behavior_patterns(ev, hw=hw, workers=WORKERS, window=(T0, T0 + 1000 * MS)).row(0, named=True)
    assert r["mu"] == pytest.approx(0.45)


def test_algorithm1_keeps_longest_intense_run():
    # a collective's samples: waiting (0), transfer with one short gap (k = 2 allows it), a long
    # pause (3 zeros > k) and a shorter burst: d_e is the first run of 4 samples
    samples = [0, 0, .9, .8, 0, .9, 0, 0, 0, .7, .7]
    nv = np.zeros(100)
    nv[: len(samples)] = np.array(samples) * 1e9
    ev = _events([("kernel", "ncclAllReduce", 0, 110, True, None)])
    cfg = PatternConfig(max_zero_run=2, link_peak_bps={"nvlink": 1e9, "pcie": None, "nic": None})
    r = behavior_patterns(ev, hw=_hw(nvlink=nv), workers=WORKERS, window=(T0, T0 + 1000 * MS), config=cfg).row(0, named=True)
    run = np.array([.9, .8, 0, .9])
    assert r["beta"] == pytest.approx(4 * 10 / 1000)
    assert r["mu"] == pytest.approx(run.mean())
    assert r["sigma"] == pytest.approx(run.std())
    assert r["resource"] == "nvlink" and r["crit_ns"] == 110 * MS


def test_trace_fallbacks_without_hw():
    ev = _events([
        ("kernel", "gemm", 0, 100, False, None), ("kernel", "gemm", 100, 200, False, None),
        ("kernel", "nccl", 300, 10, True, 1_000_000), ("kernel", "nccl", 310, 40, True, 1_000_000),
        ("python_function", "train.py: step", 350, 50, False, None),
    ])
    pats = behavior_patterns(ev, window=(T0, T0 + 1000 * MS)).sort("category")
    by = {r["category"]: r for r in pats.iter_rows(named=True)}
    assert by["compute"]["mu_source"] == "trace_speed"
    # reference = fastest decile (100 ms): u = 1 then 0.5, weighted by critical time 100 / 200
    assert by["compute"]["mu"] == pytest.approx((100 * 1.0 + 200 * 0.5) / 300)
    assert by["collective"]["mu_source"] == "trace_bytes"
    assert 0 < by["collective"]["mu"] < 1
    assert by["python"]["mu_source"] == "none" and by["python"]["mu"] is None
    assert by["python"]["beta"] == pytest.approx(0.05)


def test_empty_input_is_an_error():
    with pytest.raises(PatternError):
        behavior_patterns(_events([]).head(0))


def test_op_level_patterns_on_real_straggler_trace():
    """Compute ops never overlap on a rank, so beta(forward-compute) must equal the summed op
    durations over the summed step spans, computed here straight from the raw parquet."""
    from fleetscope.ingest.timings import read_timings

    pats = op_patterns(read_timings(REAL / "straggler_analysis", "st"))
    raw = pl.read_parquet(REAL / "straggler_analysis" / "trace-ST.parquet").with_columns(
        s=(pl.col("start_ts").cast(pl.Float64) * 1e9).round(), d=(pl.col("duration").cast(pl.Float64) * 1e9).round())
    span = raw.group_by("rank", "step").agg(w=(pl.col("s") + pl.col("d")).max() - pl.col("s").min()).group_by("rank").agg(pl.col("w").sum())
    fc = raw.filter(pl.col("optype") == "forward-compute").group_by("rank").agg(pl.col("d").sum()).join(span, on="rank")
    want = {int(r): d / w for r, d, w in fc.iter_rows()}
    got = {r: b for r, b in pats.filter(pl.col("function") == "forward-compute").select("rank", "beta").iter_rows()}
    assert set(got) == set(want) == set(range(8))
    for r in want:
        assert got[r] == pytest.approx(want[r], rel=1e-6)
    assert set(pats["stage"].unique().to_list()) == {0, 1, 2, 3}
    assert pats.filter(pl.col("function") == "forward-compute")["category"].unique().to_list() == ["compute"]
