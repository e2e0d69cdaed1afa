"""XPUTimer slowdown detectors over the metric tables -> anomaly_verdicts rows, each routed to the
team that can fix its cause (TEAM_FOR_CAUSE below, with the reasons).

Thresholds are keyword arguments with defaults that raise nothing on healthy runs (tests check both).
"""
from __future__ import annotations

import json
import re

import numpy as np
import polars as pl
from scipy import stats

from fleetscope.common import MAD_TO_SIGMA, stage_imbalance
from fleetscope.findings.verdicts import make_verdicts
from fleetscope.xputimer import metrics as M

DETECTOR = "xputimer"

# cause -> the team that can fix it: the ONE place XPUTimer's verdicts (detectors, hang, degradation)
# are routed. Table 1 of the paper groups causes by the team that usually *introduced* them (new
# algorithms, unnecessary synchronization -> algorithm; un-optimized kernels, memory management ->
# infrastructure; GPU underclocking, network jitter -> operations). fleetscope routes to the team
# that can *fix* it from what the verdict names (the project's rule: algorithm = user code and
# configuration, infrastructure = framework, kernels, libraries, operations = hardware, network, hosts):
# - python_gc -> algorithm: the pauses come from the training script's heap and GC policy, fixed
#   there (gc.freeze() after building the model, gc.disable() with collections at step boundaries,
#   Megatron's --manual-gc); the paper notes the backbones now manage it, i.e. it is configuration;
# - misaligned_kernel -> algorithm: the shape comes from the model configuration (hidden / FFN size
#   divided by the tensor-parallel degree); padding it there needs no new kernel (the paper's
#   infrastructure team wrote a padding kernel instead, the other way out);
# - minority_kernels -> infrastructure: fusing or rewriting element-wise kernels is kernel work;
# - diverged_program -> algorithm: ranks issued different collectives (the script's control flow);
# - degraded -> infrastructure: a slowdown to localize with the profile it triggers.
# The simulator's ground truth (fleetscope/sim/capture/faults.py TEAMS) is written independently;
# tests compare these verdicts with it.
TEAM_FOR_CAUSE = {
    "unnecessary_sync": "algorithm", "slow_dataloader": "algorithm", "stage_imbalance": "algorithm",
    "inter_step_cpu": "algorithm", "python_gc": "algorithm", "misaligned_kernel": "algorithm",
    "diverged_program": "algorithm", "minority_kernels": "infrastructure", "degraded": "infrastructure",
    "slow_gpu": "operations", "slow_network": "operations", "hang": "operations", "blocked": "operations",
}


def _v(**kw) -> dict:
    kw.setdefault("detector", DETECTOR)
    if isinstance(kw.get("evidence"), dict):
        kw["evidence"] = json.dumps(kw["evidence"], default=float)
    return kw


def _job(capture_id: str, job_id: str | None) -> str:
    return job_id or capture_id


# -- slow GPUs (FLOPS across ranks) ----------------------------------------------------------------
def slow_rank_rows(kf: pl.DataFrame, job_id: str | None = None, min_ratio: float = 0.8, k_mad: float = 5.0) -> list[dict]:
    """A rank whose compute kernels run below `min_ratio` of the other ranks' FLOP/s (median over
    its kernel shapes, weighted by nothing: each shape votes once) and is a robust outlier."""
    per = kf.filter(pl.col("ratio_to_ranks").is_not_null()).group_by("capture_id", "rank").agg(
        pl.col("ratio_to_ranks").median().alias("r"), pl.col("median_flops_per_s").median().alias("fps"),
        pl.len().alias("n_shapes"))
    per = per.with_columns(pl.len().over("capture_id").alias("n_ranks"),
                           pl.col("r").median().over("capture_id").alias("med"),
                           (pl.col("r") - pl.col("r").median().over("capture_id")).abs().median().over("capture_id").alias("mad"))
    bad = per.filter((pl.col("n_ranks") >= 3) & (pl.col("r") < min_ratio)
                     & ((pl.col("med") - pl.col("r")) > k_mad * MAD_TO_SIGMA * pl.max_horizontal(pl.col("mad"), 0.02 * pl.col("med"))))
    rows = []
    for r in bad.iter_rows(named=True):
        rows.append(_v(scope="rank", subject=str(r["rank"]), job_id=_job(r["capture_id"], job_id), capture_id=r["capture_id"],
                       metric="kernel_flops_ratio", value=r["r"], baseline=1.0,
                       severity="critical" if r["r"] < 0.5 else "warning", team=TEAM_FOR_CAUSE["slow_gpu"],
                       explanation=f"rank {r['rank']} runs the same compute kernels at {r['r']:.0%} of the other ranks' FLOP/s "
                                   f"(median over {r['n_shapes']} kernel shapes): a slow GPU (underclocking, thermal or power "
                                   f"throttling); isolate the machine.",
                       evidence={"median_flops_per_s": r["fps"], "n_ranks": r["n_ranks"]}))
    return rows


# -- misaligned GEMM shapes ------------------------------------------------------------------------
_ALIGN_BYTES = 128  # tensor cores want 128-byte aligned leading dimensions
_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "tf32": 4, "fp8": 1, "fp64": 8}


def _parse_shape(shape: str) -> dict:
    return {k: v for k, v in re.findall(r"(\w+)=([\w.]+)", shape or "")}


def shape_alignment(kf: pl.DataFrame) -> pl.DataFrame:
    """Per capture, kernel name, shape: median FLOP/s over ranks, whether every GEMM dimension
    (m, n, k) is a multiple of 128 bytes, and the FLOP/s of aligned shapes of similar size."""
    sh = kf.group_by("capture_id", "name", "shape").agg(pl.col("median_flops_per_s").median().alias("fps"),
                                                         pl.col("flops_per_call").median().alias("fpc"))
    al, dims = [], []
    for s in sh["shape"].to_list():
        p = _parse_shape(s)
        elem = _ALIGN_BYTES // _DTYPE_BYTES.get(p.get("dtype", "bf16"), 2)
        ds = [int(p[d]) for d in ("m", "n", "k") if d in p and p[d].isdigit()]
        # m is the token dimension and follows the batch; n and k are the model's (the ones to pad)
        nk = [int(p[d]) for d in ("n", "k") if d in p and p[d].isdigit()]
        al.append(None if not nk else all(d % elem == 0 for d in nk))
        dims.append(ds)
    sh = sh.with_columns(pl.Series("aligned", al, dtype=pl.Boolean))
    ref = sh.filter(pl.col("aligned") == True)  # noqa: E712
    joined = sh.join(ref.select("capture_id", "name", pl.col("fps").alias("ref_fps"), pl.col("fpc").alias("ref_fpc")),
                     on=["capture_id", "name"], how="left")
    # aligned shapes doing comparable work (within 4x FLOPs per call) set the expectation
    joined = joined.filter(pl.col("ref_fpc").is_null() | ((pl.col("ref_fpc") / pl.col("fpc")).is_between(0.25, 4.0)))
    exp = joined.group_by("capture_id", "name", "shape").agg(pl.col("ref_fps").median().alias("expected_fps"))
    return sh.join(exp, on=["capture_id", "name", "shape"], how="left").with_columns(
        (pl.col("fps") / pl.col("expected_fps")).alias("ratio_to_expected"))


def pad_suggestion(shape: str) -> str:
    """The dimensions of a GEMM shape to pad and to what: each of n, k that is not a multiple of
    128 bytes, rounded up to the next multiple (e.g. n=8484 in bf16 -> 8512)."""
    p = _parse_shape(shape)
    elem = _ALIGN_BYTES // _DTYPE_BYTES.get(p.get("dtype", "bf16"), 2)
    out = []
    for d in ("n", "k"):
        v = p.get(d, "")
        if v.isdigit() and int(v) % elem:
            out.append(f"{d} {int(v)} -> {-(-int(v) // elem) * elem}")
    return ", ".join(out)


def misaligned_shape_rows(kf: pl.DataFrame, job_id: str | None = None, min_ratio: float = 0.8) -> list[dict]:
    sa = shape_alignment(kf).filter((pl.col("aligned") == False) & (pl.col("ratio_to_expected") < min_ratio))  # noqa: E712
    rows = []
    for r in sa.iter_rows(named=True):
        pad = pad_suggestion(r["shape"])
        rows.append(_v(scope="kernel", subject=f"{r['name']}[{r['shape']}]", job_id=_job(r["capture_id"], job_id),
                       capture_id=r["capture_id"], metric="flops_ratio_to_aligned", value=r["ratio_to_expected"], baseline=1.0,
                       severity="warning", team=TEAM_FOR_CAUSE["misaligned_kernel"],
                       explanation=f"{r['name']} with shape {r['shape']} reaches {r['ratio_to_expected']:.0%} of the FLOP/s of "
                                   f"128-byte-aligned shapes of similar size in the same job: tensor cores want 128-byte "
                                   f"aligned dimensions; pad {pad} in the model configuration (hidden / FFN size over the "
                                   f"tensor-parallel degree), or have the kernel pad it.",
                       evidence={"flops_per_s": r["fps"], "expected_flops_per_s": r["expected_fps"], "pad": pad}))
    return rows


# -- communication bandwidth -----------------------------------------------------------------------
def slow_comm_rows(bw: pl.DataFrame, job_id: str | None = None, expected_busbw_bps: dict | None = None,
                   min_ratio: float = 0.5, min_n: int = 3) -> list[dict]:
    """A group whose median bus bandwidth is below `min_ratio` of comparable groups of the same
    capture (same collective, group size, bytes) or of the offline-profiled expectation
    (`expected_busbw_bps`: {collective: bps})."""
    # p2p transfers are left out: a recv's time includes waiting for its sender, not only the link
    b = bw.filter((pl.col("n") >= min_n) & ~pl.col("collective").is_in(["send", "recv"])).with_columns(
        pl.col("median_busbw_bps").median().over("capture_id", "collective", "group_size", "bytes").alias("peer"),
        pl.len().over("capture_id", "collective", "group_size", "bytes").alias("n_groups"))
    rows = []
    for r in b.iter_rows(named=True):
        base, how = None, ""
        if expected_busbw_bps and r["collective"] in expected_busbw_bps:
            base, how = float(expected_busbw_bps[r["collective"]]), "the profiled expectation"
        elif r["n_groups"] >= 3:
            base, how = r["peer"], f"the median of {r['n_groups']} comparable groups"
        if base is None or not r["median_busbw_bps"] or r["median_busbw_bps"] >= min_ratio * base:
            continue
        ratio = r["median_busbw_bps"] / base
        rows.append(_v(scope="dp_group", subject=str(r["group"]), job_id=_job(r["capture_id"], job_id), capture_id=r["capture_id"],
                       metric="busbw_ratio", value=ratio, baseline=1.0, severity="warning", team=TEAM_FOR_CAUSE["slow_network"],
                       explanation=f"{r['collective']} of {r['bytes']} B in group {r['group']} runs at {ratio:.0%} of {how} "
                                   f"bus bandwidth: network congestion or a degraded link in that group.",
                       evidence={"median_busbw_bps": r["median_busbw_bps"], "baseline_bps": base}))
    return rows


# -- issue latency (kernel-issue stalls) -----------------------------------------------------------
def _api_share(t: pl.DataFrame, name: str, typical: bool = False) -> float:
    """Share of the ranks' step time spent in an API. typical=True counts every call at the median
    call duration: a systematically slow API (a data loader) moves it, one call stretched by the
    OS descheduling the process does not. GC stalls are rare, long calls, so they use the sum."""
    p = M.prepare(t)
    steps = M.rank_steps(t)["span_ns"].sum()
    d = p.filter((pl.col("kind") == "api") & (pl.col("name") == name))["dur_ns"]
    tot = (d.median() or 0) * d.len() if typical else d.sum()
    return float(tot) / float(steps) if steps else 0.0


def _api_per_step(t: pl.DataFrame, name: str) -> float:
    p = M.prepare(t)
    n_steps = max(1, M.rank_steps(t).height)
    return p.filter((pl.col("kind") == "api") & (pl.col("name") == name)).height / n_steps


def issue_latency_summary(lat: pl.DataFrame, history: pl.DataFrame | None = None) -> pl.DataFrame:
    from fleetscope.schemas.base import conform
    from fleetscope.xputimer import schemas as S
    q = lat.group_by("capture_id").agg(
        pl.col("mode").first(), pl.len().cast(pl.Int64).alias("n"),
        *[pl.col("latency_frac").quantile(p).alias(f"p{int(p * 100)}") for p in (0.1, 0.25, 0.5, 0.75, 0.9)])
    ks, pv = [], []
    for cap in q["capture_id"].to_list():
        if history is None or history.height == 0:
            ks.append(None), pv.append(None)
            continue
        # latencies as fractions of the capture's median step: robust to a machine that is slower overall
        cur = lat.filter(pl.col("capture_id") == cap)["latency_frac"].drop_nulls().to_numpy()
        hist = history.filter(pl.col("capture_id") != cap)["latency_frac"].drop_nulls().to_numpy()
        if len(cur) < 20 or len(hist) < 20:
            ks.append(None), pv.append(None)
            continue
        # one-sided: a stall makes latencies SHORTER (the CPU no longer runs ahead of the device),
        # so the statistic is max(F_current - F_history); a slower device (longer latencies) is not a stall
        r = stats.ks_2samp(cur, hist, alternative="greater", method="asymp")  # exact is slow and warns at these sizes
        ks.append(float(r.statistic)), pv.append(float(r.pvalue))
    q = q.with_columns(pl.Series("ks_vs_history", ks, dtype=pl.Float64), pl.Series("p_value", pv, dtype=pl.Float64))
    return S.ISSUE_LATENCY_SUMMARY.validate(conform(q.sort("capture_id"), S.ISSUE_LATENCY_SUMMARY))


def history_drift(history_lat: pl.DataFrame, min_n: int = 40) -> float:
    """How far the job's issue-latency distribution moves with no fault at all: the two-sided KS
    distance between the first and the second half (in issue order) of each healthy history
    capture, the median over captures (0 without enough samples): the typical drift of one healthy
    capture (the maximum would grow with the number of captures kept). On a shared or loaded
    machine the latencies drift with the load; a shift no larger than that is not a stall."""
    ds = []
    for _, g in history_lat.sort("issue_ns").group_by("capture_id"):
        x = g["latency_frac"].drop_nulls().to_numpy()
        h = len(x) // 2
        if h >= min_n:
            ds.append(float(stats.ks_2samp(x[:h], x[h:], method="asymp").statistic))
    return float(np.median(ds)) if ds else 0.0


def issue_stall_rows(t: pl.DataFrame, history_t: pl.DataFrame | None, job_id: str | None = None,
                     d_threshold: float = 0.15, p_threshold: float = 1e-3, growth: float = 3.0,
                     lat: pl.DataFrame | None = None, history_lat: pl.DataFrame | None = None) -> tuple[list[dict], pl.DataFrame]:
    """Compare each capture's issue-latency distribution with the job's healthy history (earlier
    captures of the same job, given as timings). A one-sided KS distance (latencies got shorter)
    above the larger of `d_threshold` and the history's own drift (history_drift: a shift no larger
    than the healthy job moves by itself is not a stall; the bar comes from the job's data, not from a
    constant alone), and significant, flags a kernel-issue stall. The cause is the
    API whose share of step time grew `growth`-fold over the history: Python GC, dataloader.next
    (input pipeline); otherwise unnecessary
    synchronization -> algorithm (timers, .item(), cuda.synchronize in forward)."""
    lat = M.issue_latencies(t) if lat is None else lat
    if history_lat is None and history_t is not None and history_t.height:
        history_lat = M.issue_latencies(history_t)
    summ = issue_latency_summary(lat, history_lat)
    rows = []
    if history_lat is None or history_lat.height == 0:
        return rows, summ
    typical = {"gc": False, "dataloader.next": True}
    h = {n: _api_share(history_t, n, typ) for n, typ in typical.items()}
    h_sync = _api_per_step(history_t, "cuda.synchronize")
    hmed = float(history_lat["latency_frac"].median())
    drift = history_drift(history_lat)
    bar = max(d_threshold, drift)
    for r in summ.filter((pl.col("ks_vs_history") > bar) & (pl.col("p_value") < p_threshold)).iter_rows(named=True):
        cur = t.filter(pl.col("capture_id") == r["capture_id"]) if "capture_id" in t.columns else t
        c = {n: _api_share(cur, n, typ) for n, typ in typical.items()}
        n_sync = _api_per_step(cur, "cuda.synchronize")
        cmed = float(lat.filter(pl.col("capture_id") == r["capture_id"])["latency_frac"].median())
        ev = {"ks": r["ks_vs_history"], "p_value": r["p_value"], "median_latency_frac": cmed, "history_median_latency_frac": hmed,
              "gc_share": c["gc"], "history_gc_share": h["gc"], "dataloader_share": c["dataloader.next"],
              "history_dataloader_share": h["dataloader.next"], "sync_per_step": n_sync, "history_sync_per_step": h_sync,
              "history_drift": drift}
        grew = {n: c[n] / max(h[n], 1e-4) for n in h if c[n] > 0.01 and c[n] > growth * max(h[n], 1e-4)}
        top = max(grew, key=grew.get) if grew else None
        if top == "gc":
            team, metric, cause = TEAM_FOR_CAUSE["python_gc"], "issue_latency_ks_gc", (
                f"Python GC stalls the issuing thread (GC takes {c['gc']:.1%} of step time vs {h['gc']:.1%} in healthy runs): "
                f"manage GC in the training script (gc.freeze() after building the model, gc.disable() and collections at "
                f"step boundaries, Megatron's --manual-gc)")
        elif top == "dataloader.next":
            team, metric, cause = TEAM_FOR_CAUSE["slow_dataloader"], "issue_latency_ks_dataloader", (
                f"the data loader stalls the issuing thread (dataloader.next takes {c['dataloader.next']:.1%} of step time vs "
                f"{h['dataloader.next']:.1%} in healthy runs): prefetch, more workers, cheaper preprocessing")
        else:
            extra = f"; cuda.synchronize calls per step {n_sync:.1f} vs {h_sync:.1f}" if n_sync > h_sync else ""
            team, metric, cause = TEAM_FOR_CAUSE["unnecessary_sync"], "issue_latency_ks_sync", (
                f"unnecessary synchronization in the training step stalls kernel issue{extra} "
                f"(timers, .item(), printing device values, host-device copies in forward)")
        rows.append(_v(scope="job", subject=_job(r["capture_id"], job_id), job_id=_job(r["capture_id"], job_id),
                       capture_id=r["capture_id"], metric=metric, value=r["ks_vs_history"], baseline=bar,
                       severity="warning", team=team,
                       explanation=f"kernel-issue latencies got shorter than in this job's healthy history (one-sided KS "
                                   f"{r['ks_vs_history']:.2f} against a bar of {bar:.2f}, the history drifting by {drift:.2f} "
                                   f"on its own; median {cmed:.3f} vs {hmed:.3f} of a step): {cause}.",
                       evidence=ev))
    return rows, summ


def gc_stall_rows(t: pl.DataFrame, job_id: str | None = None, max_share: float = 0.03, k_mad: float = 5.0) -> list[dict]:
    """Without history: a rank whose Python GC pauses take more than `max_share` of its step time and
    stand out from its job's other ranks (a robust outlier among them; with fewer than three ranks,
    more than three times the other's share). Every rank collects garbage, and a stage that holds
    more layers allocates (and collects) more on each of its ranks: on a loaded machine stage 1 of a
    real 2-stage gloo run spent over 3 % of its short steps in GC on both its ranks, which is the
    stage's load (its own verdict), not a rank's pauses."""
    p = M.prepare(t)
    steps = M.rank_steps(t).group_by("capture_id", "rank").agg(pl.col("span_ns").sum().alias("span"))
    gcs = p.filter((pl.col("kind") == "api") & (pl.col("name") == "gc")).group_by("capture_id", "rank").agg(
        pl.col("dur_ns").sum().alias("gc"), pl.col("dur_ns").max().alias("gc_max"), pl.len().alias("n"))
    j = steps.join(gcs, on=["capture_id", "rank"], how="left").with_columns(
        pl.col("gc", "n").fill_null(0)).with_columns((pl.col("gc") / pl.col("span")).alias("share"))
    med = pl.col("share").median().over("capture_id")
    mad = (pl.col("share") - med).abs().median().over("capture_id")
    n_ranks = pl.len().over("capture_id")
    others = (pl.col("share").sum().over("capture_id") - pl.col("share")) / pl.max_horizontal(n_ranks - 1, 1)
    j = j.with_columns(pl.when(n_ranks >= 3).then((pl.col("share") - med) > k_mad * MAD_TO_SIGMA * pl.max_horizontal(mad, 0.1 * med))
                       .otherwise(pl.col("share") > 3 * others).alias("outlier"))
    rows = []
    for r in j.filter((pl.col("share") > max_share) & pl.col("outlier")).iter_rows(named=True):
        rows.append(_v(scope="rank", subject=str(r["rank"]), job_id=_job(r["capture_id"], job_id), capture_id=r["capture_id"],
                       metric="gc_share_of_step", value=r["share"], baseline=max_share, severity="warning", team=TEAM_FOR_CAUSE["python_gc"],
                       explanation=f"Python GC pauses take {r['share']:.1%} of rank {r['rank']}'s step time ({r['n']} collections, "
                                   f"longest {r['gc_max'] / 1e6:.1f} ms); every other rank waits for it at the next collective. "
                                   f"Manage GC in the training script (gc.freeze() after building the model, collections at "
                                   f"step boundaries).",
                       evidence={"gc_ns": r["gc"], "n": r["n"]}))
    return rows


# -- void percentages ------------------------------------------------------------------------------
def void_rows(void: pl.DataFrame, job_id: str | None = None, history_void: pl.DataFrame | None = None,
              v_inter_max: float = 0.15, minority_over_traced: float = 1.0, margin: float = 0.05) -> list[dict]:
    """Median V_inter / V_minority per capture above a threshold (and above the healthy history's
    median by `margin` when a history is given).

    V_minority's threshold is relative to what was traced: the void between traced kernels is
    untraced work, and how much of it is normal depends on how much the tracer covers (GEMMs only,
    or attention and backward too). So the minority kernels are flagged when they hold the device
    longer than `minority_over_traced` times the traced compute kernels themselves (median over
    rank-steps of T_minority / T_traced), not at a fixed share of the step that every untraced
    attention or backward kernel would pass; with a history, also only above its median + margin."""
    s = void.with_columns((pl.col("t_minority_ns") / pl.col("t_traced_ns")).alias("_mr")).group_by("capture_id").agg(
        pl.col("v_inter").median(), pl.col("v_minority").median(), pl.col("_mr").filter(pl.col("_mr").is_finite()).median(),
        pl.len().alias("n"))
    hi = float(history_void["v_inter"].median()) if history_void is not None and history_void.height else 0.0
    hm = float(history_void["v_minority"].median()) if history_void is not None and history_void.height else 0.0
    rows = []
    for r in s.iter_rows(named=True):
        if r["v_inter"] > max(v_inter_max, hi + margin):
            rows.append(_v(scope="job", subject=_job(r["capture_id"], job_id), job_id=_job(r["capture_id"], job_id),
                           capture_id=r["capture_id"], metric="v_inter", value=r["v_inter"], baseline=max(v_inter_max, hi),
                           severity="warning", team=TEAM_FOR_CAUSE["inter_step_cpu"],
                           explanation=f"{r['v_inter']:.0%} of each step passes between steps with no traced kernel "
                                       f"(V_inter, median over {r['n']} rank-steps): the data loader or other inter-step CPU "
                                       f"work (e.g. attention-mask generation for longer sequences) starves the GPUs."))
        mr = r["_mr"]
        if mr is not None and mr > minority_over_traced and r["v_minority"] > hm + margin:
            rows.append(_v(scope="job", subject=_job(r["capture_id"], job_id), job_id=_job(r["capture_id"], job_id),
                           capture_id=r["capture_id"], metric="v_minority", value=r["v_minority"], baseline=hm,
                           severity="warning", team=TEAM_FOR_CAUSE["minority_kernels"],
                           explanation=f"{r['v_minority']:.0%} of the in-step GPU time goes to untraced minority kernels "
                                       f"(V_minority), {mr:.1f}x the time of the traced compute kernels themselves: "
                                       f"un-optimized element-wise operators (position embedding, activation, "
                                       f"normalization); fuse or optimize them.",
                           evidence={"minority_over_traced": mr, "history_v_minority": hm}))
    return rows


# -- pipeline stage imbalance ----------------------------------------------------------------------
def stage_imbalance_rows(sm: pl.DataFrame, job_id: str | None = None, min_ratio: float = 1.15) -> list[dict]:
    """A pipeline stage whose compute per step exceeds the other stages' by `min_ratio` in every
    data-parallel replica (fleetscope.common.stage_imbalance): the model is partitioned unevenly
    (every other stage waits for it in each microbatch); one slow worker does not make its stage look so."""
    st = stage_imbalance(sm, value="compute_ns_per_step", by=("capture_id",))
    rows = []
    for r in st.filter((pl.col("n_stages") >= 2) & (pl.col("ratio") > min_ratio)).iter_rows(named=True):
        ratio = r["ratio"]
        rows.append(_v(scope="stage", subject=str(r["stage"]), job_id=_job(r["capture_id"], job_id), capture_id=r["capture_id"],
                       metric="stage_compute_ratio", value=ratio, baseline=1.0, severity="warning", team=TEAM_FOR_CAUSE["stage_imbalance"],
                       explanation=f"pipeline stage {r['stage']} (ranks {r['ranks']}) computes {ratio:.2f}x the median stage per "
                                   f"step ({r['value'] / 1e9:.2f} s vs {r['others'] / 1e9:.2f} s): stage-partitioning imbalance; move "
                                   f"layers (or the loss/embedding) off that stage.",
                       evidence={"compute_ns_per_step": r["value"], "median_ns": r["others"]}))
    return rows


def analyze(t: pl.DataFrame, history: pl.DataFrame | None = None, job_id: str | None = None,
            samples_per_step: int | None = None, expected_busbw_bps: dict | None = None) -> dict[str, pl.DataFrame]:
    """Every XPUTimer metric table of a timings frame plus its verdicts ('verdicts', validated
    anomaly_verdicts rows). history: timings of the same job's healthy captures (for the
    issue-latency and void comparisons); without it those compare with fixed thresholds only."""
    out: dict[str, pl.DataFrame] = {}
    out["xputimer_step_throughput"] = st = M.step_throughput(t, samples_per_step)
    out["xputimer_job_throughput"] = M.job_throughput(st)
    out["xputimer_kernel_flops"] = kf = M.kernel_flops(t)
    out["xputimer_comm_instances"] = ci = M.comm_instances(t)
    out["xputimer_comm_bandwidth"] = bw = M.comm_bandwidth(ci)
    out["xputimer_issue_latency"] = lat = M.issue_latencies(t)
    out["xputimer_void"] = void = M.void_percentages(t)
    out["xputimer_stage_metrics"] = sm = M.stage_metrics(t)
    slow = slow_rank_rows(kf, job_id)
    rows = slow + misaligned_shape_rows(kf, job_id) + slow_comm_rows(bw, job_id, expected_busbw_bps)
    stall, summ = issue_stall_rows(t, history, job_id, lat=lat)
    out["xputimer_issue_latency_summary"] = summ
    # a slow GPU also shortens its peers' relative issue latencies (they wait for it): when one is
    # found, an issue-latency shift without its own evidence (GC, data loader) is that consequence
    slow_caps = {r["capture_id"] for r in slow}
    rows += [r for r in stall if not (r["metric"] == "issue_latency_ks_sync" and r["capture_id"] in slow_caps)]
    rows += gc_stall_rows(t, job_id)  # names the ranks whose GC pauses (with or without history)
    hv = M.void_percentages(history) if history is not None and history.height else None
    rows += void_rows(void, job_id, hv) + stage_imbalance_rows(sm, job_id)
    out["verdicts"] = make_verdicts(rows)
    return out
