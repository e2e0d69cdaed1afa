"""The scorer counts misses AND false labels, on hand-made tables (not on detector output)."""
from __future__ import annotations

import polars as pl
import pytest

from fleetscope.sim.scoring import comm_type_accuracy, job_sets_exact
from fleetscope.sim.scoring import score_jobs, score_pairs, score_steps, score_tables, score_verdicts
from fleetscope.ingest.windows import window_id

S = 1_000_000_000
W = (1_800_000_000 * S, 1_800_000_060 * S)
T0 = W[0]

JOBS = pl.DataFrame({
    "job_id": ["A"] * 4 + ["B"] * 4,
    "ip": ["a1", "a2", "a3", "a4", "b1", "b2", "b3", "b4"],
    "host": ["h1", "h1", "h2", "h2", "h3", "h3", "h4", "h4"],
    # a4 is a NIC job A's channels avoid: no traffic on it
    "observed": [True, True, True, False, True, True, True, True],
    "first_seen_ns": [T0, T0, T0, None, T0, T0, T0, T0],
    "last_seen_ns": [W[1] - 1] * 3 + [None] + [W[1] - 1] * 4,
}, schema_overrides={"first_seen_ns": pl.Int64, "last_seen_ns": pl.Int64})
PAIRS = pl.DataFrame({"ip_a": ["a1", "a2", "b1", "b2"], "ip_b": ["a3", "a3", "b3", "b4"], "job_id": ["A", "A", "B", "B"],
                      "comm_type": ["DP", "PP", "DP", "DP"]})
BACKGROUND = pl.DataFrame({"ip_a": ["a1", "b2"], "ip_b": ["stor1", "mon1"], "role": ["storage", "probe"]})
STEPS = pl.DataFrame({"job_id": ["A"] * 3, "ip": ["a1"] * 3, "step": [1, 2, 3],
                      "start_ns": [T0 + 1 * S, T0 + 3 * S, T0 + 5 * S], "end_ns": [T0 + 3 * S, T0 + 5 * S, T0 + 7 * S],
                      "start_observed": [True, True, True]})


def test_jobs_exact_counts_all_gpus_or_the_observed_ones_and_nothing_else():
    found = pl.DataFrame({"job_id": ["x"] * 4 + ["y"] * 4, "ip": ["a1", "a2", "a3", "a4", "b1", "b2", "b3", "b4"]})
    assert job_sets_exact(found, JOBS) == (2, 2, 2)
    seen_only = pl.DataFrame({"job_id": ["x"] * 3, "ip": ["a1", "a2", "a3"]})
    assert score_jobs(seen_only, JOBS)["jobs_exact"] == 1              # the NIC with no traffic may be left out
    split = pl.DataFrame({"job_id": ["x", "x", "z", "y", "y", "y", "y"], "ip": ["a1", "a2", "a3", "b1", "b2", "b3", "b4"]})
    s = score_jobs(split, JOBS)
    assert (s["jobs_exact"], s["jobs_true"], s["jobs_found"], s["jobs_split_or_merged"]) == (1, 2, 3, 2)
    merged = pl.DataFrame({"job_id": ["m"] * 7, "ip": ["a1", "a2", "a3", "b1", "b2", "b3", "b4"]})
    assert score_jobs(merged, JOBS)["jobs_exact"] == 0


def test_a_dp_label_on_a_background_pair_is_a_false_label():
    right = PAIRS.select("ip_a", "ip_b", "comm_type")
    s = score_pairs(right, PAIRS, BACKGROUND)
    assert s["pair_accuracy"] == 1.0 and s["labels_on_background"] == 0 and s["false_pair_labels"] == 0
    planted = pl.concat([right, pl.DataFrame({"ip_a": ["stor1"], "ip_b": ["a1"], "comm_type": ["DP"]})])   # order swapped on purpose
    s = score_pairs(planted, PAIRS, BACKGROUND)
    assert s["labels_on_background"] == 1 and s["false_pair_labels"] == 1
    assert s["pairs_union"] == 5 and s["pair_accuracy"] == pytest.approx(4 / 5)
    assert s["dp_precision"] == pytest.approx(3 / 4) and s["dp_recall"] == 1.0
    # `other` on a background pair is right, and is not part of the union
    ok = pl.concat([right, pl.DataFrame({"ip_a": ["a1"], "ip_b": ["stor1"], "comm_type": ["other"]})])
    assert score_pairs(ok, PAIRS, BACKGROUND)["pair_accuracy"] == 1.0
    # the evaluate.py name scores over the union too: a false label costs accuracy
    assert comm_type_accuracy(planted, PAIRS) == (pytest.approx(0.8), 5)


def test_a_missed_pair_and_a_wrong_type_count():
    got = pl.DataFrame({"ip_a": ["a1", "a2", "b1"], "ip_b": ["a3", "a3", "b3"], "comm_type": ["DP", "DP", "DP"]})
    s = score_pairs(got, PAIRS, BACKGROUND)
    assert s["pairs_missed"] == 1 and s["pairs_wrong_type"] == 1 and s["pair_accuracy"] == pytest.approx(2 / 4)
    assert s["pp_recall"] == 0.0 and s["dp_recall"] == pytest.approx(2 / 3)


def test_a_missed_step_and_a_spurious_step_count():
    exact = STEPS.select("ip", "start_ns", "end_ns")
    s = score_steps(exact, STEPS, window=W)
    assert (s["steps_covered"], s["steps_spurious"], s["step_coverage"]) == (3, 0, 1.0)
    # drop step 2, add a step of the right length one period too late (a misaligned step is not a hit)
    got = pl.DataFrame({"ip": ["a1", "a1", "a1"], "start_ns": [T0 + 1 * S, T0 + 5 * S, T0 + 8 * S],
                        "end_ns": [T0 + 3 * S, T0 + 7 * S, T0 + 10 * S]})
    s = score_steps(got, STEPS, window=W)
    assert s["steps_covered"] == 2 and s["step_coverage"] == pytest.approx(2 / 3)
    assert s["steps_spurious"] == 1 and s["steps_reconstructed"] == 3
    # within 1 % of the duration is a hit, beyond is not
    off = exact.with_columns(end_ns=pl.col("end_ns") + pl.Series([int(0.005 * 2 * S), int(0.03 * 2 * S), 0]))
    s = score_steps(off, STEPS, window=W)
    assert s["steps_covered"] == 2 and s["steps_spurious"] == 1
    # the same step twice: the second is spurious
    s = score_steps(pl.concat([exact, exact.head(1)]), STEPS, window=W)
    assert s["steps_covered"] == 3 and s["steps_spurious"] == 1
    # a step on a NIC outside every job is spurious, one on a job NIC without DP traffic is unscored
    extra = pl.DataFrame({"ip": ["stor1", "a4"], "start_ns": [T0 + S, T0 + S], "end_ns": [T0 + 2 * S, T0 + 2 * S]})
    s = score_steps(pl.concat([exact, extra]), STEPS, window=W, truth_jobs=JOBS)
    assert s["steps_spurious"] == 1 and s["steps_unscored"] == 1


FAULTS = pl.DataFrame({"fault_id": ["F0", "F1", "F2"], "kind": ["slow_gpu", "congested_switch", "degraded_nic"],
                       "scope": ["gpu", "switch", "link"], "subject": ["a2", "spine-01", "b3"],
                       "start_ns": [T0 + 10 * S] * 3, "end_ns": [T0 + 40 * S] * 3, "job_id": ["A", None, "B"],
                       "affected_jobs": ["A", "A|B", "B"], "ips": ["a2", None, "b3"], "hosts": [None, None, None]})
EVENTS = pl.DataFrame({"event_id": ["E0"], "kind": ["checkpoint_save"], "job_id": ["B"], "scope": ["job"], "subject": ["B"],
                       "start_ns": [T0 + 50 * S], "end_ns": [T0 + 55 * S]})
CLUSTERS = pl.DataFrame({"job_id": ["j1"] * 4 + ["j2"] * 4, "ip": ["a1", "a2", "a3", "a4", "b1", "b2", "b3", "b4"]})


def _v(rows):
    base = {"detector": "d", "metric": "m", "team": "operations", "explanation": "", "severity": "warning", "job_id": None,
            "start_ns": None, "end_ns": None}
    return pl.DataFrame([base | {"verdict_id": f"v{i}"} | r for i, r in enumerate(rows)],
                        schema_overrides={"start_ns": pl.Int64, "end_ns": pl.Int64, "job_id": pl.Utf8})


def test_faults_named_exactly_at_job_level_or_missed_and_false_alarms_per_job_hour():
    v = _v([
        {"scope": "gpu", "subject": "a2", "start_ns": T0 + 20 * S, "end_ns": T0 + 21 * S},      # F0 exactly
        {"scope": "gpu", "subject": "a1", "start_ns": T0 + 20 * S, "end_ns": T0 + 21 * S},      # a TP peer: mislocalized
        {"scope": "job", "subject": "j2", "job_id": "j2", "start_ns": T0 + 30 * S, "end_ns": T0 + 31 * S},  # F1/F2 at job level
        {"scope": "step", "subject": "7", "job_id": "j2", "start_ns": T0 + 52 * S, "end_ns": T0 + 53 * S},  # the checkpoint: benign
        {"scope": "switch", "subject": "leaf-9", "start_ns": T0 + 45 * S, "end_ns": T0 + 46 * S},  # nothing active: false
        {"scope": "gpu", "subject": "a2", "start_ns": T0 + 2 * S, "end_ns": T0 + 3 * S},        # before F0 started: false
        {"scope": "job", "subject": "j1", "job_id": "j1", "severity": "info", "start_ns": T0, "end_ns": T0 + S},  # info: not scored
    ])
    s = score_verdicts(v, FAULTS, EVENTS, CLUSTERS, JOBS, W, slack_ns=S)
    pf = {r["fault_id"]: r["outcome"] for r in s["per_fault"].iter_rows(named=True)}
    assert pf == {"F0": "exact", "F1": "job_level", "F2": "job_level"}
    assert (s["faults_exact"], s["faults_job_level"], s["faults_missed"]) == (1, 2, 0)
    assert s["verdicts_loud"] == 6
    assert (s["verdicts_fault_exact"], s["verdicts_fault_job"], s["verdicts_mislocalized"], s["verdicts_benign"],
            s["verdicts_false"]) == (1, 1, 1, 1, 2)
    assert s["verdict_precision"] == pytest.approx(2 / 6)
    assert s["job_hours"] == pytest.approx(2 * 60 / 3600, rel=1e-3)
    assert s["false_alarms_per_job_hour"] == pytest.approx(2 / (2 * 60 / 3600), rel=1e-3)
    # no verdict at all: every fault missed, no false alarm
    s = score_verdicts(_v([]).head(0), FAULTS, EVENTS, CLUSTERS, JOBS, W)
    assert s["faults_missed"] == 3 and s["verdicts_loud"] == 0


def test_score_tables_reads_window_ids_and_scores_everything():
    wid = window_id(W[0], 60)
    truth = {"jobs": JOBS, "pairs": PAIRS, "steps": STEPS, "faults": FAULTS.head(0), "events": EVENTS,
             "background": BACKGROUND, "window": W}
    tables = {"job_clusters": CLUSTERS.with_columns(window_id=pl.lit(wid)),
              "comm_pairs": PAIRS.select("ip_a", "ip_b", "comm_type").with_columns(window_id=pl.lit(wid)),
              "step_timelines": STEPS.select("ip", "start_ns", "end_ns").with_columns(window_id=pl.lit(wid)),
              "anomaly_verdicts": _v([{"scope": "host", "subject": "h3", "start_ns": T0 + S, "end_ns": T0 + 2 * S}])}
    s = score_tables(tables, truth)
    assert (s["jobs_exact"], s["jobs_true"]) == (2, 2) and s["pair_accuracy"] == 1.0 and s["step_coverage"] == 1.0
    assert s["verdicts_false"] == 1 and s["faults"] == 0


def test_a_compute_fault_named_on_its_gpus_host_is_exact_a_network_fault_on_a_host_is_not():
    # flows see a late GPU as its host's late traffic (its tensor-parallel group waits with it):
    # the host holding it is its exact subject from flows; another host, or a host for a NIC, is not
    def outcome(rows):
        s = score_verdicts(_v(rows), FAULTS, EVENTS, CLUSTERS, JOBS, W, slack_ns=S)
        return {r["fault_id"]: (r["outcome"], r["on_host"]) for r in s["per_fault"].iter_rows(named=True)}, s

    when = {"start_ns": T0 + 20 * S, "end_ns": T0 + 21 * S}
    pf, s = outcome([{"scope": "host", "subject": "h1"} | when])            # a2's host
    assert pf["F0"] == ("exact", True) and s["faults_on_host"] == 1 and s["verdicts_fault_exact"] == 1
    pf, s = outcome([{"scope": "host", "subject": "h2"} | when])            # job A's other host
    assert pf["F0"][0] != "exact" and s["verdicts_mislocalized"] == 1
    pf, s = outcome([{"scope": "host", "subject": "h4"} | when])            # degraded NIC b3's host
    assert pf["F2"][0] != "exact"
    pf, s = outcome([{"scope": "gpu", "subject": "a2"} | when])             # the GPU itself
    assert pf["F0"] == ("exact", False)
