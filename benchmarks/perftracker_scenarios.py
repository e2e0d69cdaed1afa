"""PerfTracker localization on the simulator's scenarios and on the real StragglerAnalysis trace.

    .venv/bin/python -m benchmarks.perftracker_scenarios [--seed S] [--scenarios a,b,...]

For each scenario: render it (fleetscope.sim.capture.scenario_capture), read what landed (traces,
timings, hw) the way the platform does, compute patterns + verdicts, then compare the warning /
critical verdicts with the ground truth (which the analysis never sees): the truth function must
be named by a verdict routed to the truth team, and the ranks it names are scored against the
truth ranks. Every other warning/critical verdict is counted as a false verdict."""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]

from fleetscope.ingest.hw import read_hw  # noqa: E402
from fleetscope.ingest.timings import read_capture_layout, read_timings  # noqa: E402
from fleetscope.perftracker.analyze import diagnose_op_capture, diagnose_trace_capture  # noqa: E402
from fleetscope.ingest.traces import read_capture  # noqa: E402

SCENARIOS = ["healthy", "throttled_racks", "nvlink_down", "slow_dataloader", "cpu_bound_forward", "gc_stall", "slow_stage_worker"]
REAL = ROOT / ".." / "shared" / "data" / "real" / "straggler_analysis"


def run_scenario(scenario: str, seed: int, tmp: Path) -> dict:
    from fleetscope.sim.capture import scenario_capture

    t0 = time.perf_counter()
    landing, truth = scenario_capture(tmp / scenario, scenario, seed)
    t_render = time.perf_counter() - t0
    cap_dir = next((landing / "traces").iterdir())
    cap = cap_dir.name
    t0 = time.perf_counter()
    events = read_capture(cap_dir, cap)
    timings = read_timings(landing / "timings" / cap, cap)
    hw = pl.concat([read_hw(p).kept for p in sorted((landing / "hw").iterdir())])
    layout = read_capture_layout(cap_dir)
    pats, verdicts = diagnose_trace_capture(events, cap, hw=hw, timings=timings, layout=layout)
    t_analyze = time.perf_counter() - t0
    loud = verdicts.filter(pl.col("severity").is_in(["warning", "critical"]))
    row = {"scenario": scenario, "render_s": round(t_render, 1), "analyze_s": round(t_analyze, 1),
           "patterns": pats.height, "loud_verdicts": loud.height}
    if not truth:
        row.update(truth_function="-", truth_team="-", detected=loud.height == 0, team_ok=True, rank_recall=None, rank_precision=None,
                   other_functions=loud.height, off_truth_ranks=loud.height,
                   verdict="nothing reported" if loud.height == 0 else "FALSE ALARMS")
        return row
    tdf = pl.DataFrame(truth)
    t_ranks = set(tdf["rank"].to_list())
    team = tdf["team"][0]
    names = [n for n in {tdf["function"][0], tdf["kernel"][0]} if n]
    names_hit = pl.any_horizontal([pl.col("subject").str.contains(n, literal=True) for n in names])
    hit = loud.filter(names_hit)
    hit_team = hit.filter(pl.col("team") == team)
    ranks = set()
    for ev in hit_team["evidence"].to_list():
        ranks |= set(json.loads(ev).get("ranks", []))
    all_ranks = [set(json.loads(ev).get("ranks", [])) for ev in loud["evidence"].to_list()]
    recall = len(ranks & t_ranks) / len(t_ranks) if t_ranks else None
    precision = len(ranks & t_ranks) / len(ranks) if ranks else 0.0
    row.update(truth_function=tdf["function"][0][-40:], truth_team=team, truth_ranks=len(t_ranks), detected=hit_team.height > 0,
               team_ok=hit_team.height > 0 and hit.filter(pl.col("team") != team).height == 0,
               rank_recall=None if recall is None else round(recall, 2), rank_precision=round(precision, 2),
               other_functions=loud.height - hit.height,
               off_truth_ranks=sum(1 for r in all_ranks if not r <= t_ranks),
               verdict=(hit_team.with_columns(n=pl.col("evidence").str.json_path_match("$.ranks").str.count_matches(",")).sort(
                   "n", descending=True)["explanation"][0][:160] if hit_team.height else
                        (hit["explanation"][0][:160] if hit.height else "MISSED")))
    return row


def run_real() -> dict:
    t0 = time.perf_counter()
    tm = read_timings(REAL, "straggler_analysis")
    pats, verdicts = diagnose_op_capture(tm, "straggler_analysis")
    dt = time.perf_counter() - t0
    loud = verdicts.filter(pl.col("severity").is_in(["warning", "critical"]))
    stage = loud.filter((pl.col("scope") == "stage") & (pl.col("subject") == "3") & (pl.col("team") == "algorithm"))
    return {"scenario": "real:straggler_analysis", "analyze_s": round(dt, 2), "patterns": pats.height, "loud_verdicts": loud.height,
            "truth_function": "stage 3 (too long)", "truth_team": "algorithm", "detected": stage.height > 0, "team_ok": stage.height > 0,
            "other_functions": loud.height - stage.height, "off_truth_ranks": loud.filter(pl.col("scope") != "stage").height,
            "verdict": stage["explanation"][0][:150] if stage.height else "MISSED"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="pt_scen_") as tmp:
        for s in a.scenarios.split(","):
            rows.append(run_scenario(s, a.seed, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    rows.append(run_real())
    print(json.dumps(rows[-1]))
    df = pl.DataFrame(rows, infer_schema_length=None)
    cols = [c for c in ["scenario", "truth_function", "truth_team", "truth_ranks", "detected", "team_ok", "rank_recall", "rank_precision",
                        "loud_verdicts", "other_functions", "off_truth_ranks", "analyze_s"] if c in df.columns]
    with pl.Config(tbl_rows=50, tbl_width_chars=250, fmt_str_lengths=40, tbl_cols=20, tbl_hide_dataframe_shape=True):
        print(df.select(cols))
    for r in rows:
        print(f"- {r['scenario']}: {r['verdict']}")


if __name__ == "__main__":
    main()
