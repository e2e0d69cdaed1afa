"""Score what the flow analytics wrote (docs/CONTRACT.md 2 tables: job_clusters, comm_pairs, step_timelines,
anomaly_verdicts) against a simulation's ground truth, counting misses AND false labels.

- jobs: a found job is exact when its ip set equals a true job's (all its GPUs, or the GPUs whose
  NICs carry its traffic in that window: a NIC the job's channels avoid is invisible to flows);
- pairs: accuracy over the union of true pairs and pairs labelled DP/PP (a DP/PP label on a pair
  that is not a job pair is wrong, a true pair without its label is wrong); DP/PP labels on
  background pairs (storage, checkpoint, monitoring, probe, control) are counted on their own;
- steps: a true step is covered when a reconstructed step of the same ip ends within `tol` of its
  duration and (when its start is observable in flows) starts within `tol`; reconstructed steps
  inside the simulated window that match no true step, or a true step already matched, are spurious;
- verdicts: per fault, named exactly (scope and subject are the fault's, times overlap), only at job
  level (a verdict on a job the fault slowed), or missed; every warning/critical verdict is a fault
  finding, mislocalized (names a wrong switch/NIC/GPU/host while a fault is active on its job),
  explained by a benign event (launch, checkpoint, stall, finish, crash), or a false alarm. False
  alarms are reported per job-hour.

Nothing here is seen by the analyses; tests and benchmarks call it. Tables may come from a
warehouse (one or several windows, `window_id` as fleetscope.ingest.windows writes it) or straight from an
analysis call (no window_id: the whole simulated window).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

LOUD = ["warning", "critical"]
LOCALIZING = ["gpu", "link", "host", "switch"]
IP_SCOPES = ["gpu", "link"]
# faults of one GPU's computing (scope gpu): named on their host counts (score_verdicts.exact)
COMPUTE_KINDS = {"slow_gpu", "straggler", "gc_stall"}
TRUTH_NAMES = ("jobs", "pairs", "steps", "faults", "events", "background", "job_layout")


# ---- loading ------------------------------------------------------------------------------------------------

def load_truth(gt_dir: str | Path) -> dict:
    """Ground truth of one simulation: frames by name plus "window" (start_ns, end_ns)."""
    gt = Path(gt_dir)
    out: dict = {}
    for name in TRUTH_NAMES:
        p = gt / f"{name}.csv"
        out[name] = pl.read_csv(p, infer_schema_length=None) if p.exists() else pl.DataFrame()
    s = gt / "summary.json"
    out["window"] = tuple(json.loads(s.read_text())["window"]) if s.exists() else None
    return out


def _windows(df: pl.DataFrame, default: tuple[int, int] | None) -> dict[str, tuple[int, int]]:
    """window_id -> (start, end) for the windows a table names ("" when it has no window_id)."""
    from fleetscope.ingest.windows import parse_window_id

    if "window_id" not in df.columns or df.height == 0:
        return {"": default or (-(2**62), 2**62)}
    out = {}
    for w in df["window_id"].drop_nulls().unique().to_list():
        try:
            out[w] = parse_window_id(w)
        except (ValueError, IndexError):
            out[w] = default or (-(2**62), 2**62)
    return out


def _wid(df: pl.DataFrame) -> pl.DataFrame:
    return df if "window_id" in df.columns else df.with_columns(window_id=pl.lit(""))


# ---- jobs ---------------------------------------------------------------------------------------------------

def _truth_sets(truth_jobs: pl.DataFrame, lo: int, hi: int) -> dict[str, tuple[frozenset, frozenset]]:
    """true job -> (all its ips, ips carrying its traffic inside [lo, hi)) for jobs seen there."""
    out = {}
    has_seen = "first_seen_ns" in truth_jobs.columns
    for (jid,), g in truth_jobs.group_by("job_id"):
        full = frozenset(g["ip"].to_list())
        if has_seen:
            seen = g.filter(pl.col("first_seen_ns").is_not_null() & (pl.col("first_seen_ns") < hi)
                            & (pl.col("last_seen_ns") >= lo))
            if seen.height == 0:
                continue
            out[jid] = (full, frozenset(seen["ip"].to_list()))
        else:
            out[jid] = (full, full)
    return out


def match_jobs(job_clusters: pl.DataFrame, truth_jobs: pl.DataFrame, window: tuple[int, int] | None = None) -> pl.DataFrame:
    """One row per found job (window_id, job_id): the true job sharing most of its ips, the Jaccard
    similarity, and whether it is exact."""
    jc = _wid(job_clusters)
    rows = []
    ip_job = dict(zip(truth_jobs["ip"].to_list(), truth_jobs["job_id"].to_list()))
    wins = _windows(jc, window)
    for (w, j), g in jc.group_by("window_id", "job_id"):
        lo, hi = wins.get(w, window or (-(2**62), 2**62))
        sets = _truth_sets(truth_jobs, lo, hi)
        ips = frozenset(g["ip"].to_list())
        cand = [ip_job[i] for i in ips if i in ip_job]
        best = max(set(cand), key=cand.count) if cand else None
        jac, exact = 0.0, False
        if best is not None:
            full, seen = sets.get(best, (frozenset(truth_jobs.filter(pl.col("job_id") == best)["ip"].to_list()), frozenset()))
            jac = max(len(ips & full) / len(ips | full), len(ips & seen) / len(ips | seen) if seen else 0.0)
            exact = ips == full or ips == seen
        rows.append({"window_id": w, "job_id": j, "truth_job_id": best, "jaccard": jac, "exact": exact, "n_ips": len(ips)})
    if not rows:
        return pl.DataFrame(schema={"window_id": pl.Utf8, "job_id": pl.Utf8, "truth_job_id": pl.Utf8, "jaccard": pl.Float64,
                                    "exact": pl.Boolean, "n_ips": pl.Int64})
    return pl.DataFrame(rows, schema_overrides={"truth_job_id": pl.Utf8})


def score_jobs(job_clusters: pl.DataFrame, truth_jobs: pl.DataFrame, window: tuple[int, int] | None = None) -> dict:
    """exact / n_true (true jobs alive in each window scored, summed over windows) / n_found."""
    m = match_jobs(job_clusters, truth_jobs, window)
    jc = _wid(job_clusters)
    wins = _windows(jc, window)
    n_true = 0
    exact = 0
    for w, (lo, hi) in wins.items():
        sets = _truth_sets(truth_jobs, lo, hi)
        n_true += len(sets)
        mw = m.filter((pl.col("window_id") == w) & pl.col("exact"))
        exact += mw["truth_job_id"].n_unique()
    n_found = m.height
    return {"jobs_exact": exact, "jobs_true": n_true, "jobs_found": n_found,
            "jobs_exact_share": exact / n_true if n_true else float("nan"),
            "jobs_split_or_merged": int((~m["exact"]).sum()) if m.height else 0, "matches": m}


# ---- pairs --------------------------------------------------------------------------------------------------

def _norm_pairs(df: pl.DataFrame, col: str) -> pl.DataFrame:
    return df.select(ip_a=pl.min_horizontal("ip_a", "ip_b").cast(pl.Utf8), ip_b=pl.max_horizontal("ip_a", "ip_b").cast(pl.Utf8),
                     label=pl.col(col).cast(pl.Utf8))


def score_pairs(comm_pairs: pl.DataFrame, truth_pairs: pl.DataFrame, background: pl.DataFrame | None = None,
                col: str = "comm_type") -> dict:
    """Label accuracy over the union of true job pairs and pairs labelled DP/PP (a pair seen in
    several windows takes its most frequent label), DP/PP recall and precision, and DP/PP labels on
    background pairs."""
    t = _norm_pairs(truth_pairs.filter(pl.col("comm_type").is_in(["DP", "PP"])), "comm_type").rename({"label": "truth"}).unique(["ip_a", "ip_b"])
    if comm_pairs.height:
        p = _norm_pairs(comm_pairs, col).group_by("ip_a", "ip_b", "label").agg(n=pl.len())
        p = p.sort("ip_a", "ip_b", "n", "label", descending=[False, False, True, False]).unique(["ip_a", "ip_b"], keep="first").drop("n")
    else:
        p = pl.DataFrame(schema={"ip_a": pl.Utf8, "ip_b": pl.Utf8, "label": pl.Utf8})
    labelled = p.filter(pl.col("label").is_in(["DP", "PP"]))
    u = t.join(p, on=["ip_a", "ip_b"], how="full", coalesce=True)
    u = u.filter(pl.col("truth").is_not_null() | pl.col("label").is_in(["DP", "PP"]))
    ok = (u["truth"] == u["label"]).fill_null(False)
    out = {"pairs_union": u.height, "pairs_true": t.height, "pairs_correct": int(ok.sum()),
           "pair_accuracy": float(ok.mean()) if u.height else float("nan"),
           "pairs_missed": int(u.filter(pl.col("truth").is_not_null() & ~pl.col("label").is_in(["DP", "PP"]).fill_null(False)).height),
           "pairs_wrong_type": int(u.filter(pl.col("truth").is_not_null() & pl.col("label").is_in(["DP", "PP"])
                                            & (pl.col("truth") != pl.col("label"))).height),
           "false_pair_labels": int(u.filter(pl.col("truth").is_null()).height)}
    for k in ("DP", "PP"):
        tk = u.filter(pl.col("truth") == k)
        pk = u.filter(pl.col("label") == k)
        out[f"{k.lower()}_recall"] = float((tk["label"] == k).fill_null(False).mean()) if tk.height else float("nan")
        out[f"{k.lower()}_precision"] = float((pk["truth"] == k).fill_null(False).mean()) if pk.height else float("nan")
    if background is not None and background.height:
        b = _norm_pairs(background.with_columns(x=pl.lit("")), "x").select("ip_a", "ip_b").unique()
        on_bg = labelled.join(b, on=["ip_a", "ip_b"], how="semi")
        out["labels_on_background"] = on_bg.height
        out["background_pairs"] = b.height
    else:
        out["labels_on_background"] = 0
        out["background_pairs"] = 0
    return out


# ---- steps --------------------------------------------------------------------------------------------------

def score_steps(step_timelines: pl.DataFrame, truth_steps: pl.DataFrame, tol: float = 0.01,
                window: tuple[int, int] | None = None, truth_jobs: pl.DataFrame | None = None) -> dict:
    """Coverage of true steps and spurious reconstructed steps (see the module docstring)."""
    t = truth_steps.select("ip", t_start="start_ns", t_end="end_ns",
                           t_obs=(pl.col("start_observed") if "start_observed" in truth_steps.columns else pl.lit(True)))
    t = t.with_columns(t_dur=pl.col("t_end") - pl.col("t_start"), t_id=pl.int_range(0, pl.len())).sort("t_end")
    s = step_timelines.select(pl.col("ip").cast(pl.Utf8), p_start=pl.col("start_ns").cast(pl.Int64), p_end=pl.col("end_ns").cast(pl.Int64))
    s = s.filter(pl.col("p_start").is_not_null() & pl.col("p_end").is_not_null())
    lo, hi = window if window is not None else ((int(t["t_start"].min()), int(t["t_end"].max()) + 1) if t.height else (0, 0))
    scoreable = s.filter((pl.col("p_start") >= lo) & (pl.col("p_end") < hi)).with_columns(p_id=pl.int_range(0, pl.len())).sort("p_end")

    def ok(df):
        return (((pl.col("p_end") - pl.col("t_end")).abs() <= tol * pl.col("t_dur"))
                & (~pl.col("t_obs") | ((pl.col("p_start") - pl.col("t_start")).abs() <= tol * pl.col("t_dur"))))

    # coverage: each true step against the reconstructed step of its ip ending nearest
    cov = t.join_asof(scoreable, left_on="t_end", right_on="p_end", by="ip", strategy="nearest", check_sortedness=False)
    cov = cov.with_columns(hit=ok(cov).fill_null(False))
    # spurious: each reconstructed step against the true step of its ip ending nearest
    sp = scoreable.join_asof(t, left_on="p_end", right_on="t_end", by="ip", strategy="nearest", check_sortedness=False)
    sp = sp.with_columns(hit=ok(sp).fill_null(False))
    dup = sp.filter(pl.col("hit")).group_by("t_id").agg(n=pl.len()).select((pl.col("n") - 1).sum())
    n_dup = int(dup.item()) if dup.height and dup.item() is not None else 0
    job_ips = set(truth_jobs["ip"].to_list()) if truth_jobs is not None and truth_jobs.height else None
    truth_ips = set(t["ip"].to_list())
    miss = sp.filter(~pl.col("hit"))
    # reconstructed steps on job NICs that carry no DP traffic (PP-only): no truth to score against
    unscored = miss.filter(~pl.col("ip").is_in(list(truth_ips)) & (pl.col("ip").is_in(list(job_ips)) if job_ips else pl.lit(False)))
    spurious = miss.height - unscored.height + n_dup
    hit = cov.filter(pl.col("hit"))
    rel = ((hit["p_end"] - hit["p_start"]) - hit["t_dur"]).abs() / hit["t_dur"] if hit.height else pl.Series([], dtype=pl.Float64)
    return {"steps_true": t.height, "steps_covered": hit.height, "step_coverage": hit.height / t.height if t.height else float("nan"),
            "steps_reconstructed": scoreable.height, "steps_spurious": spurious,
            "spurious_share": spurious / scoreable.height if scoreable.height else 0.0, "steps_unscored": unscored.height,
            "step_err_median": float(rel.median()) if rel.len() else float("nan"),
            "step_err_p99": float(rel.quantile(0.99)) if rel.len() else float("nan")}


# ---- verdicts -----------------------------------------------------------------------------------------------

def _split(v) -> list[str]:
    return [x for x in str(v or "").split("|") if x and x != "None"]


def score_verdicts(verdicts: pl.DataFrame, faults: pl.DataFrame, events: pl.DataFrame | None = None,
                   job_clusters: pl.DataFrame | None = None, truth_jobs: pl.DataFrame | None = None,
                   window: tuple[int, int] | None = None, slack_ns: int = 5_000_000_000) -> dict:
    """Per-fault outcome (exact / job_level / missed) and the class of every warning/critical verdict
    (fault_exact, fault_job, mislocalized, benign, false)."""
    W0, W1 = window if window is not None else (-(2**62), 2**62)
    tj = truth_jobs if truth_jobs is not None else pl.DataFrame({"job_id": [], "ip": [], "host": []},
                                                                  schema={"job_id": pl.Utf8, "ip": pl.Utf8, "host": pl.Utf8})
    ip_job = dict(zip(tj["ip"].to_list(), tj["job_id"].to_list()))
    host_jobs: dict[str, set] = {}
    if "host" in tj.columns:
        for h, j in zip(tj["host"].to_list(), tj["job_id"].to_list()):
            host_jobs.setdefault(h, set()).add(j)
    found_to_truth: dict[tuple[str, str], str | None] = {}
    if job_clusters is not None and job_clusters.height and tj.height:
        m = match_jobs(job_clusters, tj, window)
        for r in m.iter_rows(named=True):
            found_to_truth[(r["window_id"], r["job_id"])] = r["truth_job_id"]
            found_to_truth.setdefault(("", r["job_id"]), r["truth_job_id"])
    loud = _wid(verdicts).filter(pl.col("severity").is_in(LOUD)) if verdicts.height else pl.DataFrame()
    frows = list(faults.iter_rows(named=True)) if faults.height else []
    erows = list(events.iter_rows(named=True)) if events is not None and events.height else []
    for f in frows:
        f["_affected"] = set(_split(f.get("affected_jobs"))) | ({f["job_id"]} if f.get("job_id") else set())
        f["_ips"] = set(_split(f.get("ips")))
        f["_hosts"] = set(_split(f.get("hosts")))
        f["_hits"] = {"exact": [], "job_level": [], "on_host": []}

    def vjobs(v) -> set:
        js = set()
        if v.get("job_id") is not None:
            tj_ = found_to_truth.get((v.get("window_id") or "", v["job_id"])) or found_to_truth.get(("", v["job_id"]))
            if tj_:
                js.add(tj_)
        subj = str(v.get("subject"))
        if v["scope"] in IP_SCOPES and subj in ip_job:
            js.add(ip_job[subj])
        if v["scope"] == "host":
            js |= host_jobs.get(subj, set())
        return js

    def overlaps(vs, ve, a, b) -> bool:
        return vs <= b + slack_ns and ve >= a - slack_ns

    ip_host = dict(zip(tj["ip"].to_list(), tj["host"].to_list())) if "host" in tj.columns else {}

    def exact(v, f) -> bool:
        sc, subj = v["scope"], str(v["subject"])
        if f["scope"] == "gpu" and f["kind"] in COMPUTE_KINDS and sc == "host":
            # a GPU computing late holds back its whole tensor-parallel group (and a member without
            # its own NIC sends through another's): from flows alone its host is the exact answer
            # (issue 25: "name the host, and the GPU where the rail / NIC pattern allows")
            if subj == ip_host.get(f["subject"]):
                f["_hits"]["on_host"].append(v["verdict_id"])
                return True
            return False
        if f["scope"] in ("gpu", "link"):
            return sc in IP_SCOPES and subj == f["subject"]
        if f["scope"] == "switch":
            return sc == "switch" and subj == f["subject"]
        if f["scope"] == "host":
            return sc == "host" and subj == f["subject"]
        if f["scope"] == "rack":
            return sc == "host" and subj in f["_hosts"]
        if f["scope"] == "job":
            return (sc == "job" and f["job_id"] in vjobs(v)) or (sc in IP_SCOPES and subj in f["_ips"])
        return False

    classes = []
    for v in (loud.iter_rows(named=True) if loud.height else []):
        vs = v.get("start_ns")
        ve = v.get("end_ns")
        vs = W0 if vs is None else int(vs)
        ve = (vs if v.get("start_ns") is not None else W1) if ve is None else int(ve)
        js = vjobs(v)
        active = [f for f in frows if overlaps(vs, ve, f["start_ns"], f["end_ns"])]
        cls = None
        for f in active:
            if exact(v, f):
                f["_hits"]["exact"].append(v["verdict_id"])
                cls = "fault_exact"
        if cls is None:
            hit = [f for f in active if js & f["_affected"]]
            if v["scope"] in LOCALIZING:
                if hit or (v["scope"] == "switch" and any(f["kind"] in ("congested_switch", "degraded_nic", "flapping_link")
                                                          for f in active)):
                    cls = "mislocalized"
            elif hit:
                cls = "fault_job"
                for f in hit:
                    f["_hits"]["job_level"].append(v["verdict_id"])
        if cls is None and any(e["job_id"] in js and overlaps(vs, ve, e["start_ns"], e["end_ns"]) for e in erows):
            cls = "benign"
        classes.append({"verdict_id": v["verdict_id"], "detector": v.get("detector"), "scope": v["scope"],
                        "subject": str(v["subject"]), "class": cls or "false"})
    per_fault = pl.DataFrame([{"fault_id": f["fault_id"], "kind": f["kind"], "scope": f["scope"], "subject": f["subject"],
                               "outcome": "exact" if f["_hits"]["exact"] else ("job_level" if f["_hits"]["job_level"] else "missed"),
                               "on_host": bool(f["_hits"]["on_host"]) and len(f["_hits"]["on_host"]) == len(f["_hits"]["exact"]),
                               "n_verdicts": len(f["_hits"]["exact"]) + len(f["_hits"]["job_level"]),
                               "impact": f.get("impact")} for f in frows],
                             schema={"fault_id": pl.Utf8, "kind": pl.Utf8, "scope": pl.Utf8, "subject": pl.Utf8,
                                     "outcome": pl.Utf8, "on_host": pl.Boolean, "n_verdicts": pl.Int64, "impact": pl.Float64})
    vc = pl.DataFrame(classes, schema={"verdict_id": pl.Utf8, "detector": pl.Utf8, "scope": pl.Utf8, "subject": pl.Utf8,
                                       "class": pl.Utf8})
    count = {c: int((vc["class"] == c).sum()) for c in ("fault_exact", "fault_job", "mislocalized", "benign", "false")}
    hours = job_hours(tj, window)
    n_loud = vc.height
    return {"faults": len(frows), "faults_exact": int((per_fault["outcome"] == "exact").sum()),
            "faults_on_host": int(per_fault["on_host"].sum()),
            "faults_job_level": int((per_fault["outcome"] == "job_level").sum()),
            "faults_missed": int((per_fault["outcome"] == "missed").sum()),
            "verdicts_loud": n_loud, **{f"verdicts_{k}": v for k, v in count.items()},
            "verdict_precision": (count["fault_exact"] + count["fault_job"]) / n_loud if n_loud else float("nan"),
            "job_hours": hours, "false_alarms_per_job_hour": count["false"] / hours if hours > 0 else float("nan"),
            "per_fault": per_fault, "verdict_classes": vc}


def job_hours(truth_jobs: pl.DataFrame, window: tuple[int, int] | None = None) -> float:
    """Hours each true job was seen, summed over jobs (inside the window when given)."""
    if truth_jobs.height == 0 or "first_seen_ns" not in truth_jobs.columns:
        return 0.0
    g = truth_jobs.group_by("job_id").agg(a=pl.col("first_seen_ns").min(), b=pl.col("last_seen_ns").max()).drop_nulls()
    a, b = g["a"].to_numpy(), g["b"].to_numpy()
    if window is not None:
        a, b = np.maximum(a, window[0]), np.minimum(b, window[1])
    return float(np.clip(b - a, 0, None).sum() / 3.6e12)


# ---- everything ---------------------------------------------------------------------------------------------

def score_tables(tables: dict[str, pl.DataFrame], truth: dict | str | Path, tol: float = 0.01) -> dict:
    """All scores for one set of analysis tables (names as docs/CONTRACT.md 2: job_clusters, comm_pairs,
    step_timelines, anomaly_verdicts; any may be missing) against a truth folder or load_truth()."""
    tr = load_truth(truth) if isinstance(truth, (str, Path)) else truth
    w = tr.get("window")
    empty = pl.DataFrame()
    jc = tables.get("job_clusters", empty)
    out: dict = {}
    if jc.height or tr["jobs"].height:
        jc_ = jc if jc.height else pl.DataFrame(schema={"job_id": pl.Utf8, "ip": pl.Utf8})
        out.update({k: v for k, v in score_jobs(jc_, tr["jobs"], w).items() if k != "matches"})
    cp = tables.get("comm_pairs", empty)
    cp_ = cp if cp.height else pl.DataFrame(schema={"ip_a": pl.Utf8, "ip_b": pl.Utf8, "comm_type": pl.Utf8})
    out.update(score_pairs(cp_, tr["pairs"], tr.get("background")))
    st = tables.get("step_timelines", empty)
    st_ = st if st.height else pl.DataFrame(schema={"ip": pl.Utf8, "start_ns": pl.Int64, "end_ns": pl.Int64})
    out.update(score_steps(st_, tr["steps"], tol, w, tr["jobs"]))
    v = tables.get("anomaly_verdicts", empty)
    v_ = v if v.height else pl.DataFrame(schema={"verdict_id": pl.Utf8, "scope": pl.Utf8, "subject": pl.Utf8,
                                                  "severity": pl.Utf8, "job_id": pl.Utf8, "start_ns": pl.Int64,
                                                  "end_ns": pl.Int64})
    out.update(score_verdicts(v_, tr["faults"], tr.get("events"), jc if jc.height else None, tr["jobs"], w))
    return out


def score_warehouse(warehouse: str | Path, truth: dict | str | Path, tol: float = 0.01) -> dict:
    """score_tables over the tables of a fleetscope warehouse."""
    from fleetscope.warehouse import Warehouse

    wh = Warehouse(Path(warehouse))  # a table the run never wrote reads as its empty placeholder
    return score_tables({name: wh.read(name) for name in ("job_clusters", "comm_pairs", "step_timelines", "anomaly_verdicts")},
                        truth, tol)


# -- the names the flow tests and benchmarks call ---------------------------------------------------
def job_sets_exact(job_clusters: pl.DataFrame, truth_jobs: pl.DataFrame) -> tuple[int, int, int]:
    """(exact, n_true, n_found): true jobs (job_id, ip) whose ip set equals one found job's."""
    s = score_jobs(job_clusters, truth_jobs)
    return s["jobs_exact"], s["jobs_true"], s["jobs_found"]


def comm_type_accuracy(comm_pairs: pl.DataFrame, truth_pairs: pl.DataFrame, col: str = "comm_type") -> tuple[float, int]:
    """(accuracy, n) over the union of true DP/PP pairs and pairs labelled DP/PP by `col` (comm_type,
    or raw_type = no refinement): a true pair absent or mislabelled is wrong, and so is a DP/PP
    label on a pair that is not a true one."""
    s = score_pairs(comm_pairs, truth_pairs, None, col)
    return s["pair_accuracy"], s["pairs_union"]


def wire_steps(truth_steps: pl.DataFrame, truth_pairs: pl.DataFrame, flows: pl.DataFrame) -> pl.DataFrame:
    """The true steps on the wire's clock: each step ends with the last flow of its address's
    boundary pairs (DP, or PP for an address without DP pairs) that ended by the step's logged
    end, and starts where the previous one ended on the wire. A training script logs the end of
    its gradient all-reduce when its thread next runs after the last byte arrived: on a loaded
    host milliseconds later, which no network observer can see (the simulator's truth is on the
    wire already: there the two agree). The script's log still decides which step a flow closes;
    the analysis never sees either."""
    if truth_steps.height == 0 or flows.height == 0 or truth_pairs.height == 0:
        return truth_steps
    p = truth_pairs.filter(pl.col("comm_type").is_in(["DP", "PP"])).select("ip_a", "ip_b", "comm_type")
    both = pl.concat([p.select(ip="ip_a", peer="ip_b", ct="comm_type"), p.select(ip="ip_b", peer="ip_a", ct="comm_type")])
    src = both.group_by("ip").agg(has_dp=(pl.col("ct") == "DP").any())
    both = both.join(src, on="ip").filter((pl.col("ct") == "DP") | ~pl.col("has_dp")).select("ip", "peer")
    f = pl.concat([flows.select(ip="src_ip", peer="dst_ip", e="end_ns"), flows.select(ip="dst_ip", peer="src_ip", e="end_ns")])
    f = f.join(both, on=["ip", "peer"]).select("ip", pl.col("e").cast(pl.Int64)).sort("ip", "e")
    t = truth_steps.with_columns(pl.col("end_ns").cast(pl.Int64)).sort("ip", "end_ns")
    w = t.join_asof(f.rename({"e": "wire"}), left_on="end_ns", right_on="wire", by="ip", strategy="backward",
                    check_sortedness=False)
    prev_log = pl.col("end_ns").shift(1).over("ip")
    # a wire end before the previous step's logged end belongs to that step: this one shows none
    w = w.with_columns(wire=pl.when(prev_log.is_null() | (pl.col("wire") > prev_log)).then("wire").otherwise("end_ns"))
    w = w.with_columns(wire=pl.coalesce("wire", "end_ns"))
    prev_wire = pl.col("wire").shift(1).over("ip")
    obs = pl.col("start_observed") if "start_observed" in w.columns else pl.lit(True)
    return w.with_columns(start_ns=pl.when(obs & prev_wire.is_not_null()).then(prev_wire).otherwise("start_ns"),
                          end_ns=pl.col("wire")).drop("wire").select(truth_steps.columns)


def step_errors(steps: pl.DataFrame, truth_steps: pl.DataFrame) -> pl.DataFrame:
    """Match each reconstructed step (start observed) to the true step of the same ip with the
    nearest end; rel_err = |reconstructed - true duration| / true duration. Coverage and spurious
    steps: fleetscope.sim.scoring.score_steps."""
    s = steps.filter("start_observed").select("ip", "start_ns", "end_ns").sort("ip", "end_ns")
    t = truth_steps.select("ip", t_start=pl.col("start_ns"), t_end=pl.col("end_ns")).sort("ip", "t_end")
    j = s.join_asof(t, left_on="end_ns", right_on="t_end", by="ip", strategy="nearest", check_sortedness=False)
    return j.with_columns(
        rel_err=((pl.col("end_ns") - pl.col("start_ns")) - (pl.col("t_end") - pl.col("t_start"))).abs()
        / (pl.col("t_end") - pl.col("t_start")))
