"""The what-if straggler analysis and the baseline forecast on real gloo PP x DP jobs recorded with
one cause made for real (tests/data/prism_real, fleetscope.collectors.recorder.cases): a worker on
a CPU-throttled host, variable sequence lengths per microbatch, a heavy last stage, each recorded
at the same time as a re-run without the cause. The truth (which rank was throttled, which stage
got more layers, the microbatches' lengths, the re-run's step time by the ranks' own clocks) comes
from the runner and the ranks' logs; the analysis reads only the tracer's op rows.

Seed 1: its sequence-length and heavy-stage cases were recorded and scored after the method was
frozen (out of sample); its throttled-worker case changed the method after it was first scored
(a collective of the worker's own stage is now taken from another stage's: it was +14.7 %)."""
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from fleetscope.collectors.recorder.cases import case_timings
from fleetscope.prism.forecast import heldout_check, straggler_verdicts
from fleetscope.prism.stragglers import analyze_stragglers

DATA = Path(__file__).resolve().parents[1] / "data" / "prism_real"
CASES = sorted(p.parent.name for p in DATA.glob("*/truth.json") if not p.parent.name.endswith("-rerun"))
IDEAL_TOL = 0.05  # issue 22: no_stragglers within 5 % of the re-run without the cause


def test_the_recordings_are_there():
    kinds = {json.loads((DATA / c / "truth.json").read_text())["kind"] for c in CASES}
    assert kinds == {"slow_worker", "seq", "heavy_stage"}, CASES
    for c in CASES:
        assert (DATA / f"{c}-rerun" / "truth.json").exists(), c


@pytest.fixture(scope="module")
def analyzed():
    out = {}
    for name in CASES + [f"{c}-rerun" for c in CASES]:
        truth = json.loads((DATA / name / "truth.json").read_text())
        t = case_timings(DATA / name)
        a = analyze_stragglers(t)
        out[name] = (truth, t, a, straggler_verdicts(a))
    return out


def _loud(v):
    return v.filter(pl.col("severity").is_in(["warning", "critical"]))


def test_case_timings_come_back_through_the_ingest_whole(analyzed):
    for name, (truth, t, a, _) in analyzed.items():
        assert t.height == truth["op_rows"], name
        assert a.graph.n_ranks == truth["world"] and len(a.graph.steps) == truth["steps"], name
        # the fused send/recv slots keep their names' shared start and end
        assert "backward-recv+forward-send" in set(a.graph.slot_names()), name
        assert a.summary["replay_max_error"][0] < 1e-3, name


@pytest.mark.parametrize("case", CASES)
def test_no_stragglers_is_the_re_run_without_the_cause(analyzed, case):
    truth_ns = json.loads((DATA / f"{case}-rerun" / "truth.json").read_text())["measured_step_ns"]
    _, _, a, _ = analyzed[case]
    assert abs(a.ideal_with_gaps_ns / truth_ns - 1) < IDEAL_TOL, (case, a.ideal_with_gaps_ns / 1e6, truth_ns / 1e6)
    # and the job was slower than that (the cause cost something), by more than the tolerance
    assert json.loads((DATA / case / "truth.json").read_text())["measured_step_ns"] > (1 + IDEAL_TOL) * truth_ns


@pytest.mark.parametrize("case", CASES)
def test_verdicts_name_the_injected_cause_and_nothing_else(analyzed, case):
    truth, _, a, v = analyzed[case]
    loud = _loud(v)
    job = loud.filter(pl.col("detector") == "prism.no_stragglers")
    rest = loud.filter(pl.col("detector") != "prism.no_stragglers")
    assert job.height == 1
    if truth["kind"] == "slow_worker":
        want = str(truth["slow_worker"]["rank"])
        assert rest.select("scope", "subject", "team").rows() == [("rank", want, "operations")]
        assert json.loads(a.summary["mw_workers"][0]) == [truth["slow_worker"]["rank"]]
    elif truth["kind"] == "heavy_stage":
        assert rest.select("scope", "subject", "team").rows() == [("stage", str(truth["pp"] - 1), "algorithm")]
    else:
        assert rest.select("scope", "metric", "team").rows() == [("job", "sequence_length_imbalance", "algorithm")]


@pytest.mark.parametrize("case", CASES)
def test_the_healthy_re_runs_raise_nothing(analyzed, case):
    _, _, a, v = analyzed[f"{case}-rerun"]
    assert _loud(v).height == 0, _loud(v).select("scope", "subject", "explanation").rows()
    assert a.causes.height == 0


def test_seq_lengths_are_recognized_from_the_ops_alone(analyzed):
    """The microbatch effect the analysis finds tracks the lengths the ranks logged."""
    case = next(c for c in CASES if analyzed[c][0]["kind"] == "seq")
    _, _, a, _ = analyzed[case]
    s = a.summary.row(0, named=True)
    assert s["seq_icc"] > 0.5 and s["mseq"] > 0.3
    g = a.graph
    mbs = pl.read_parquet(DATA / case / "microbatches.parquet")
    fwd = (g.slot_names() == "forward-compute") & (g.stage[g.slot_rank] == 0)
    sl = g.slots.filter(pl.Series(fwd)).select("slot", "dp_rank", "microbatch")
    x = sl.join(pl.DataFrame({"step": g.steps.astype(np.int64)}), how="cross").with_columns(
        dur=pl.Series(g.dur[sl["slot"].to_numpy()].ravel()))
    x = x.join(mbs.with_columns(pl.col("dp_rank").cast(pl.Int64), pl.col("microbatch").cast(pl.Int32)),
               on=["step", "dp_rank", "microbatch"])
    # the recording ran at load ~19 on 2 cores: wake-ups jitter every op; without the lengths
    # the correlation would be ~0
    assert x.height > 1000 and np.corrcoef(x["dur"].to_numpy(), x["tokens"].to_numpy())[0, 1] > 0.4


@pytest.mark.parametrize("case", CASES)
def test_forecast_on_held_out_steps_is_as_close_as_the_machine_lets_it(analyzed, case):
    """Fitted on the first half, scored on the second: the forecast must not be farther from the
    held-out steps than the first half's own steps are (the shared machine's load drifts between
    halves; no model fitted on the first half can see that), and within 1 % plus that drift."""
    for name in (case, f"{case}-rerun"):
        ho = heldout_check(analyzed[name][2].graph, n=6000)
        assert ho["heldout_ks"] <= ho["halves_ks"] + 0.03, (name, ho)
        assert abs(ho["heldout_mean_error_pct"]) <= abs(ho["halves_mean_diff_pct"]) + 1.0, (name, ho)


def test_one_slow_worker_on_a_quiet_machine_takes_the_whole_slowdown(analyzed):
    """Issue 22: a one-slow-worker case has M_W >= 0.95 and no_stragglers within 5 % of ideal_ns.
    Seed 5 was recorded on a quiet machine (load ~0 before; only the job and its re-run running):
    the healthy job's own step-to-step variation, which the artifact's M_W counts in T_ori - T_ideal,
    is small there (on the shared box at load 11-19, seed 1, M_W reads 0.84-0.89)."""
    truth, _, a, v = analyzed["slow_worker-s5"]
    s = a.summary.row(0, named=True)
    assert json.loads(s["mw_workers"]) == [truth["slow_worker"]["rank"]]
    assert s["mw"] >= 0.95, s["mw"]
    assert abs(s["ideal_with_gaps_ns"] / s["ideal_ns"] - 1) <= 0.05, (s["ideal_with_gaps_ns"], s["ideal_ns"])


def test_a_collective_whose_every_member_waits_on_the_slow_worker_is_not_typical(analyzed):
    """PP2 x DP4, seed 8: the throttled rank's stage all-reduce (four members, all slowed) holds half
    of the all-reduce slots. Its median over every slot and step together (the artifact's choice) put
    ideal_ns 17 % above the re-run without the throttle; the ideal can never be slower than that."""
    truth, _, a, _ = analyzed["slow_worker-s8"]
    assert truth["pp"] == 2 and truth["dp"] == 4
    rerun_ns = json.loads((DATA / "slow_worker-s8-rerun" / "truth.json").read_text())["measured_step_ns"]
    assert a.summary["ideal_ns"][0] < rerun_ns, (a.summary["ideal_ns"][0] / 1e6, rerun_ns / 1e6)
