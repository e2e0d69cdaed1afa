"""Accuracy of the flow analytics on data nobody shaped for it, scored by fleetscope.sim.scoring
(misses AND false labels; the analysis never sees the truth):

- simulated fleets whose conventions and fault places are drawn per seed (fleetscope.sim), a healthy
  twin and a faulty one (`random:N` flow-visible faults) per seed, `--minutes` long (default 2),
  analysed the way the wiring does: 60 s windows, each with a 30 s margin before it;
- the real recordings under tests/data/recordings (real PyTorch gloo jobs in network namespaces),
  and the recorder matrix under tests/data/flow_matrix (design / first_look / held_out: which of
  them informed which rule is said in its README), each folder given to --recordings its own set.

Tuning used seeds 0-49 only; report on seeds >= 1000 (held out). Steps are scored on the true steps
ending before the last 20 s of the data (a window claims a step once the step after it has begun,
so the very last steps of the data belong to a window that has not come yet).

    .venv/bin/python -m benchmarks.flows_accuracy --seeds 1000-1019 [--gpus 128] [--faults random:2]
        [--recordings tests/data/recordings] [--data /tmp/fs_flows_acc] [--details]
    .venv/bin/python -m benchmarks.flows_accuracy --seeds "" --recordings tests/data/flow_matrix/*
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import polars as pl

from benchmarks.flows_common import analyze_span, load_landing, load_truth, score

TAIL_NS = 20_000_000_000
REPO = Path(__file__).resolve().parents[1]


def parse_seeds(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        if "-" in part:
            a, b = part.split("-")
            out += list(range(int(a), int(b) + 1))
        elif part:
            out.append(int(part))
    return out


def run_folder(folder: Path, tail_ns: int = TAIL_NS) -> dict:
    flows, topo, stats = load_landing(folder / "landing")
    truth = load_truth(folder / "ground_truth")
    w = truth["window"] or (int(flows["start_ns"].min()), int(flows["end_ns"].max()) + 1)
    t = time.perf_counter()
    tables = analyze_span(flows, topo, (int(w[0]), int(w[1])), flush=tail_ns == 0)
    secs = time.perf_counter() - t
    bg = truth.get("background")
    if bg is not None and bg.height and "ip_a" not in bg.columns and "ip" in bg.columns:
        # recordings list background addresses (a store, a prober): their pairs are every pair
        # the flows show with one of them
        ips = bg["ip"].implode()
        truth["background"] = flows.filter(pl.col("src_ip").is_in(ips) | pl.col("dst_ip").is_in(ips)).select(
            ip_a=pl.min_horizontal("src_ip", "dst_ip"), ip_b=pl.max_horizontal("src_ip", "dst_ip")).unique()
    # a recording's truth is on its scripts' clock: its steps are scored on the wire's too
    # (scoring.wire_steps); the simulator's truth is its own flows' already
    recorded = (folder / "ground_truth" / "recording.json").exists()
    s = score(tables, truth, step_span=(int(w[0]), int(w[1]) - tail_ns), flows=flows if recorded else None)
    s.update(secs=secs, flows=flows.height, notes=tables.get("notes", []), _tables=tables, _truth=truth)
    return s


def simulated(data: Path, seed: int, gpus: int, minutes: float, faults: str) -> Path:
    from fleetscope.sim import simulate

    folder = data / f"g{gpus}-m{minutes:g}-s{seed}-{faults.replace(':', '') or 'healthy'}"
    if not (folder / "ground_truth" / "summary.json").exists():
        simulate(folder, gpus=gpus, minutes=minutes, faults=faults, seed=seed, captures=False, overwrite=True)
    return folder


SUMS = ["jobs_exact", "jobs_true", "jobs_found", "pairs_union", "pairs_correct", "false_pair_labels",
        "labels_on_background", "background_pairs", "steps_true", "steps_covered", "steps_reconstructed",
        "steps_spurious", "steps_true_script", "steps_covered_script", "faults", "faults_exact", "faults_job_level", "faults_missed", "verdicts_loud",
        "verdicts_fault_exact", "verdicts_fault_job", "verdicts_mislocalized", "verdicts_benign", "verdicts_false",
        "job_hours", "secs", "flows"]


def summarize(name: str, runs: list[dict]) -> dict:
    t = {k: sum(r.get(k, 0) or 0 for r in runs) for k in SUMS}
    loud = t["verdicts_loud"]
    return {
        "set": name, "runs": len(runs),
        "jobs_exact": f"{t['jobs_exact']}/{t['jobs_true']} ({t['jobs_found']} found)",
        "pair_acc": t["pairs_correct"] / t["pairs_union"] if t["pairs_union"] else float("nan"),
        "dp_pp_on_background": t["labels_on_background"],
        "steps_within_1pct": t["steps_covered"] / t["steps_true"] if t["steps_true"] else float("nan"),
        # recordings: the same steps against the scripts' own clock (host latency after the last byte)
        "script_clock": t["steps_covered_script"] / t["steps_true_script"] if t["steps_true_script"] else float("nan"),
        "spurious": t["steps_spurious"] / t["steps_reconstructed"] if t["steps_reconstructed"] else 0.0,
        "faults_exact": f"{t['faults_exact']}/{t['faults']} (+{t['faults_job_level']} job-level)",
        "precision": (t["verdicts_fault_exact"] + t["verdicts_fault_job"]) / loud if loud else float("nan"),
        "loud": loud, "false_alarms": t["verdicts_false"], "benign_loud": t["verdicts_benign"],
        "mislocalized": t["verdicts_mislocalized"],
        "fa_per_job_hour": t["verdicts_false"] / t["job_hours"] if t["job_hours"] else float("nan"),
        "analyze_s": t["secs"], "flows": t["flows"],
    }


def print_table(rows: list[dict]) -> None:
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="1000-1009")
    ap.add_argument("--gpus", type=int, default=128)
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--faults", default="random:2", help='"none": healthy fleets only')
    ap.add_argument("--recordings", nargs="*", default=[str(REPO / "tests" / "data" / "recordings")])
    ap.add_argument("--data", default="/tmp/fs_flows_acc")
    ap.add_argument("--details", action="store_true", help="per run lines and verdicts on stderr")
    a = ap.parse_args()
    data = Path(a.data)
    data.mkdir(parents=True, exist_ok=True)
    seeds = parse_seeds(a.seeds)
    sets: dict[str, list[dict]] = {"sim healthy": [], "sim faulty": []}
    for seed in seeds:
        specs = [("sim healthy", "")] + ([("sim faulty", a.faults)] if a.faults not in ("", "none") else [])
        for name, spec in specs:
            r = run_folder(simulated(data, seed, a.gpus, a.minutes, spec))
            sets[name].append(r)
            if a.details:
                _detail(f"{name} seed {seed}", r)
    for root in a.recordings or []:
        if not Path(root).is_dir():   # a shell glob over a folder picks up its README too
            continue
        # one set per folder of recordings (tests/data/flow_matrix: design, first_look, held_out)
        # (named with their parent: tests/data/flow_matrix/held_out and tests/data/flow_fsdp/held_out
        # are two sets)
        label = "recording" if Path(root).name == "recordings" else f"{Path(root).parent.name}/{Path(root).name}"
        for folder in sorted(p for p in Path(root).iterdir() if (p / "ground_truth").is_dir()):
            r = run_folder(folder, tail_ns=0)
            key = f"{label} healthy" if r["faults"] == 0 else f"{label} faulty"
            sets.setdefault(key, []).append(r)
            if a.details:
                _detail(f"recording {folder.name}", r)
    rows = [summarize(k, v) for k, v in sets.items() if v]
    print_table(rows)
    kinds = per_kind(sets)
    if kinds.height:
        print()
        print_table(kinds.to_dicts())
    return 0


def per_kind(sets: dict[str, list[dict]]) -> pl.DataFrame:
    """Per set and fault kind: faults named on their exact subject (on_host: a compute fault on its
    GPU's host), at job level only, missed."""
    parts = [r["per_fault"].with_columns(set=pl.lit(name)) for name, runs in sets.items() for r in runs
             if isinstance(r.get("per_fault"), pl.DataFrame) and r["per_fault"].height]
    if not parts:
        return pl.DataFrame()
    return pl.concat(parts).group_by("set", "kind").agg(
        faults=pl.len(), exact=(pl.col("outcome") == "exact").sum(),
        # of those, named on the GPU's host only (a compute fault: scoring.COMPUTE_KINDS)
        on_host=(pl.col("outcome").eq("exact") & pl.col("on_host").fill_null(False)).sum(),
        job_level=(pl.col("outcome") == "job_level").sum(),
        missed=(pl.col("outcome") == "missed").sum()).sort("set", "kind")


def _detail(name: str, r: dict) -> None:
    keys = ["jobs_exact", "jobs_true", "jobs_found", "pair_accuracy", "labels_on_background", "step_coverage",
            "spurious_share", "step_coverage_script", "faults", "faults_exact", "verdicts_loud", "verdicts_false", "secs"]
    print(name, {k: (round(r[k], 4) if isinstance(r.get(k), float) else r.get(k)) for k in keys}, file=sys.stderr)
    v = r["_tables"].get("anomaly_verdicts")
    if v is not None and v.height:
        loud = v.filter(pl.col("severity") != "info")
        for row in loud.select("detector", "scope", "subject", "severity").iter_rows():
            print("    loud:", row, file=sys.stderr)
    f = r["_truth"]["faults"]
    if f.height:
        for row in f.select("kind", "scope", "subject").iter_rows():
            print("    fault:", row, file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
