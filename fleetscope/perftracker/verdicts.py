"""PerfTracker's findings as anomaly_verdicts rows: abnormal functions (localize), imbalanced
stages (stage_differential) and straggling ranks (ranks), each named for the team that owns it."""
from __future__ import annotations

import json

import polars as pl

from fleetscope.findings.verdicts import make_verdicts
from fleetscope.perftracker.localize import LocalizeConfig
from fleetscope.perftracker.schemas import DIMENSIONS

# (category, kind) -> team. kind: 'differential' (some workers differ from their peers) or
# 'expectation' (the function is out of its expected box, typically on every worker).
TEAM_RULES = {
    ("compute", "differential"): ("operations", "GPU slower than its peers (throttling or a faulty GPU)"),
    ("compute", "expectation"): ("infrastructure", "GPU kernel outside its expected pattern"),
    ("memory", "differential"): ("operations", "memory copies slower than on peers (PCIe / host)"),
    ("memory", "expectation"): ("infrastructure", "memory operations hold the critical path"),
    ("collective", "differential"): ("operations", "collective communication slower than on peers (link, NVLink or NIC)"),
    ("collective", "expectation"): ("infrastructure", "collective communication holds the critical path (communication configuration)"),
    ("python", "differential"): ("algorithm", "a CPU function stalls some workers (e.g. garbage collection at random times)"),
    ("python", "expectation"): ("algorithm", "a CPU function bottlenecks training (user code: data loading, CPU-bound Python)"),
}


def _ranks_text(ranks: list[int], limit: int = 24) -> str:
    ranks = sorted(set(int(r) for r in ranks))
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    text = ",".join(parts)
    return text if len(parts) <= limit else ",".join(parts[:limit]) + f",... ({len(ranks)} ranks)"


def _short(function: str, n: int = 120) -> str:
    leaf = function.rsplit(" > ", 1)[-1]
    return leaf if len(leaf) <= n else leaf[: n - 3] + "..."


def _loud(kind: pl.Expr, dim: pl.Expr, category: pl.Expr, mu_source: pl.Expr, material: pl.Expr) -> pl.Expr:
    """Which findings become warning/critical verdicts and which stay info:
    - a collective's critical time includes waiting for slower peers unless Algorithm 1 refined
      it with fine-grained link samples, so a collective that differs (or is out of its box) only
      in beta is a symptom of someone else's slowness: info;
    - a difference in sigma alone (the spread of coarse samples), or one where no dimension
      differs materially (diff_material false), is too weak on its own: info."""
    waiting = (category == "collective") & (dim == "beta") & (mu_source != "hw_alg1")
    return ~(waiting | ((kind == "differential") & ((dim == "sigma") | ~material)))


def patterns_verdicts(localized: pl.DataFrame, stages: pl.DataFrame | None = None, job_id: str | None = None,
                      config: LocalizeConfig = LocalizeConfig(), ranks: pl.DataFrame | None = None) -> pl.DataFrame:
    """Localized patterns (+ stage_differential rows, + straggling_ranks rows) -> anomaly_verdicts:
    one verdict per abnormal function (leaf name: the call stacks it appears in are listed in the
    evidence), kind (differential: the workers that differ from their peers; expectation: the
    workers above what is expected, from the job's history or a configured box) and loudness,
    naming the workers and the dimension that differs; one verdict per imbalanced stage; one per
    straggling rank (detector perftracker.rank). Severity from the impact (the share of the window
    the finding costs): critical from critical_impact, else warning; symptoms (see _loud) and
    findings that only describe where a straggling rank loses its time are info."""
    rows: list[dict] = []
    strag = {} if ranks is None or ranks.height == 0 else {
        c: set(g["rank"].to_list()) for (c,), g in ranks.group_by("capture_id")}
    ab = localized.filter(pl.col("abnormal").fill_null(False))
    if ab.height:
        if "impact" not in ab.columns:
            ab = ab.with_columns(impact=pl.col("beta"))
        if "container" not in ab.columns:
            ab = ab.with_columns(container=pl.lit(None, pl.Boolean))
        if "expected_source" not in ab.columns:
            ab = ab.with_columns(expected_source=pl.lit("config"), expected_beta_hi=pl.lit(None, pl.Float64))
        ab = ab.with_columns(kind=pl.when(pl.col("reason") == "expectation").then(pl.lit("expectation")).otherwise(pl.lit("differential")),
                             dim=pl.when(pl.col("reason") == "expectation").then(pl.col("exp_dim")).otherwise(pl.col("diff_dim")),
                             leaf=pl.col("function_name").fill_null(pl.col("function")))
        ab = ab.with_columns(loud=_loud(pl.col("kind"), pl.col("dim"), pl.col("category"), pl.col("mu_source").fill_null("none"),
                                        pl.col("diff_material").fill_null(True)))
        peers = localized.with_columns(leaf=pl.col("function_name").fill_null(pl.col("function"))).group_by("capture_id", "leaf").agg(
            *[pl.col(c).filter(~pl.col("abnormal").fill_null(False)).median().alias(f"peer_{c}") for c in DIMENSIONS],
            n_workers=pl.col("rank").n_unique())
        grp = ab.group_by("capture_id", "leaf", "kind", "loud").agg(
            category=pl.col("category").first(), ranks=pl.col("rank").unique().sort(), stages=pl.col("stage").drop_nulls().unique().sort(),
            dim=pl.col("dim").mode().sort().first(), dims=pl.col("dim").unique().sort(), stacks=pl.col("function").unique().sort(),
            beta=pl.col("beta").median(), mu=pl.col("mu").median(), sigma=pl.col("sigma").median(), d_exp=pl.col("d_exp").max(),
            d_diff=pl.col("d_diff").median(), thr=pl.col("d_diff_threshold").max(), delta=pl.col("diff_delta").median(),
            mu_source=pl.col("mu_source").mode().sort().first(), resource=pl.col("resource").mode().sort().first(),
            impact=pl.col("impact").median(), container=pl.col("container").fill_null(False).any(),
            exp_source=pl.col("expected_source").drop_nulls().mode().sort().first(), exp_hi=pl.col("expected_beta_hi").median(),
        ).join(peers, on=["capture_id", "leaf"], how="left").sort("capture_id", "leaf", "kind", "loud")
        for r in grp.iter_rows(named=True):
            team, why = TEAM_RULES[(r["category"], r["kind"])]
            dim = r["dim"] or "beta"
            val, base = r[dim], r[f"peer_{dim}"]
            workers = _ranks_text(r["ranks"])
            dims = "/".join(d for d in r["dims"] if d)
            if r["kind"] == "differential":
                direction = "higher" if (r["delta"] or 0) > 0 else "lower"
                how = (f"{dim} {val:.3g} vs {base:.3g} on their peers ({direction}; differs in {dims}; d_diff {r['d_diff']:.0f} of the "
                       f"sampled peers > threshold {r['thr']:.3g})") if (base is not None and val is not None) else f"{dim} {direction} than peers"
            elif r["exp_source"] == "history":
                base = r["exp_hi"]
                how = (f"beta {r['beta']:.3g} above the {r['exp_hi']:.3g} this job's earlier captures give for it on this stage "
                       f"(its usual share plus noise; d_exp {r['d_exp']:.3g})")
            else:
                box = config.expected.get(r["category"], {}).get(dim, (0.0, 1.0))
                how = f"{dim} {val:.3g} outside the configured [{box[0]:g}, {box[1]:g}] (d_exp {r['d_exp']:.3g})"
            res = ("critical-path share" if dim == "beta" else f"{r['resource'] or ''} utilization from {r['mu_source'] or ''}")
            symptom = r["category"] == "collective" and dim == "beta"
            part_of = sorted(set(r["ranks"]) & strag.get(r["capture_id"], set()))
            subsumed = bool(part_of) and set(r["ranks"]) <= strag.get(r["capture_id"], set())
            loud = r["loud"] and not subsumed
            note = ("" if loud else f" Where rank(s) {_ranks_text(part_of)} lose their time: see the straggling-rank verdict." if subsumed
                    else " Symptom only: a collective's time includes waiting for slower peers." if symptom
                    else " Weak alone: only the spread of coarse samples differs." if dim == "sigma"
                    else " Weak alone: no dimension differs by 0.75 theta or more.")
            what = (f"{_short(r['leaf'])} self time (time inside this {'annotation' if r['category'] == 'python' else 'wrapper'} "
                    f"no traced operator covers: Python, data loading, waits the profiler does not see)" if r["container"] else _short(r["leaf"]))
            impact = r["impact"] or 0.0
            expl = (f"{what} ({r['category']}) abnormal on {len(r['ranks'])} of {r['n_workers']} workers "
                    f"(ranks {workers}): {how} [{res}]; it costs {100 * impact:.0f} % of the window. {why}.{note}")
            sev = ("critical" if impact >= config.critical_impact else "warning") if loud else "info"
            metric = f"{r['kind']}_{dim}" + ("" if loud else ("_rank" if subsumed else "_symptom" if symptom else "_weak"))
            rows.append(dict(
                detector="perftracker", scope="function", subject=r["leaf"], job_id=job_id, capture_id=r["capture_id"],
                metric=metric, value=float(val) if val is not None else None,
                baseline=float(base) if base is not None else None, severity=sev, team=team, explanation=expl,
                evidence=json.dumps({"ranks": [int(x) for x in r["ranks"]], "stages": [int(x) for x in r["stages"]], "kind": r["kind"],
                                     "dimension": dim, "dimensions": [d for d in r["dims"] if d], "beta": r["beta"], "mu": r["mu"],
                                     "sigma": r["sigma"], "d_diff": r["d_diff"], "d_exp": r["d_exp"], "mu_source": r["mu_source"],
                                     "resource": r["resource"], "impact": impact, "container": r["container"],
                                     "expected_source": r["exp_source"], "call_stacks": r["stacks"][:20]}),
            ))
    if ranks is not None and ranks.height:
        rows += rank_verdict_rows(ranks, job_id, config)
    if stages is not None and stages.height:
        for r in stages.iter_rows(named=True):
            ratio = r["beta"] / r["beta_others"] if r["beta_others"] else float("inf")
            rows.append(dict(
                detector="perftracker", scope="stage", subject=str(r["stage"]), job_id=job_id, capture_id=r["capture_id"],
                metric=f"stage_beta:{r['function']}", value=float(r["beta"]), baseline=float(r["beta_others"]),
                severity="critical" if ratio >= 1.25 and r["beta"] - r["beta_others"] >= config.critical_impact else "warning",
                team="algorithm",
                explanation=(f"pipeline stage {r['stage']} (ranks {_ranks_text(r['ranks'])}) holds the critical path in {r['function']} "
                             f"{ratio:.2f}x as long as the other {r['n_stages'] - 1} stages (beta {r['beta']:.3g} vs {r['beta_others']:.3g}): "
                             f"the stages are unbalanced; repartition layers across stages (stage partitioning)."),
                evidence=json.dumps({"ranks": [int(x) for x in r["ranks"]], "stage": int(r["stage"]), "function": r["function"],
                                     "d_diff": int(r["d_diff"]), "n_stages": int(r["n_stages"])}),
            ))
    return make_verdicts(rows)


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.0f} ms" if abs(ns) < 1e10 else f"{ns / 1e9:,.1f} s"


def rank_verdict_rows(ranks: pl.DataFrame, job_id: str | None, config) -> list[dict]:
    """One anomaly_verdicts row per straggling rank: scope rank, subject the rank number, team
    operations (a slower GPU or host) unless the evidence says user code (half or more of the
    excess in one Python function of the user's)."""
    rows = []
    for r in ranks.iter_rows(named=True):
        top = r["top"] or []
        where = "; ".join(f"{_short(t['function'], 60)}{' (self time: untraced work inside it)' if t['container'] else ''} "
                          f"[{t['category']}] +{_ms(t['excess_ns'])}" for t in top[:3])
        user = (r["user_code_share"] or 0) >= 0.5
        team = "algorithm" if user else "operations"
        why = ("most of the extra time is in one Python function of the job's code: a data- or rank-dependent code path (user code)"
               if user else "the same work takes longer on this rank: a slower or throttled GPU / host, or a noisy neighbour on it")
        peers = f"ranks {_ranks_text(r['peers'])}" if r["peers"] else f"{r['n_peers']} peers"
        where_rank = f"rank {r['rank']}" + (f" (host {r['host']})" if r["host"] else "") + (f", stage {r['stage']}" if r["stage"] is not None else "")
        consequence = ""
        if r["waiting"]:
            consequence = (f" Ranks {_ranks_text(r['waiting'])} spend {100 * (r['others_wait_share'] or 0):.0f} % of their window in "
                           f"communication vs {100 * r['wait_share']:.0f} % on this rank: they wait for it (pipeline successors, "
                           f"data-parallel peers): a consequence, not a cause.")
        rows.append(dict(
            detector="perftracker.rank", scope="rank", subject=str(r["rank"]), job_id=job_id, capture_id=r["capture_id"],
            metric="own_time_vs_stage_peers", value=float(r["own_ns"]), baseline=float(r["ref_ns"]),
            severity="critical" if r["impact"] >= config.critical_impact else "warning", team=team,
            explanation=(f"{where_rank} is a straggler: its own work (everything but communication) takes {_ms(r['own_ns'])} of its "
                         f"{_ms(r['window_ns'])} window vs {_ms(r['ref_ns'])} on its same-stage peers ({peers}): {r['ratio']:.2f}x, "
                         f"+{100 * r['impact']:.0f} % of the window. Where: {where or 'spread over many functions'}. {why}."
                         f"{consequence}"),
            evidence=json.dumps({"ranks": [int(r["rank"])], "stage": r["stage"], "host": r["host"], "peers": r["peers"],
                                 "own_ns": r["own_ns"], "ref_ns": r["ref_ns"], "ratio": r["ratio"], "impact": r["impact"],
                                 "functions": [{**t, "excess_ns": float(t["excess_ns"])} for t in top],
                                 "user_code_share": r["user_code_share"], "waiting_ranks": r["waiting"],
                                 "wait_share": r["wait_share"], "others_wait_share": r["others_wait_share"]}),
        ))
    return rows
