"""What people read: the problems as text (CLI) and markdown, the incident report and the fleet
health page, with PNG plots. Plain functions over warehouse frames; the Dagster assets write the
files and show the markdown. Nothing is cut: long text wraps."""
from __future__ import annotations

import datetime as dt
import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

_SEV = {"critical": 0, "warning": 1, "info": 2}


def _ts(ns) -> str:
    if ns is None:
        return "-"
    return dt.datetime.fromtimestamp(int(ns) / 1e9, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def md_table(df: pl.DataFrame, cols: list[str], n: int = 20, more: str = "_... {n} more_") -> str:
    """A markdown table of the first n rows, every cell whole (pipes escaped, line breaks flattened);
    `more` says how many rows were left out ({n} is replaced)."""
    if df.height == 0:
        return "_none_\n"
    cols = [c for c in cols if c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.head(n).select(cols).iter_rows():
        lines.append("| " + " | ".join(("" if v is None else str(v)).replace("|", "\\|").replace("\n", " ") for v in row) + " |")
    left = f"\n{more.replace('{n}', str(df.height - n))}" if df.height > n else ""
    return "\n".join(lines) + left + "\n"


def problems_text(problems: pl.DataFrame, limit: int = 10) -> str:
    """The problems for a terminal: most severe first, each with its subject, team, why that team,
    what to do and its evidence count; wrapped, never cut."""
    import textwrap

    if problems.height == 0:
        return "no warning or critical findings."
    lines = [f"problems ({problems.height}; one per cause, most severe first; table `problems`, evidence in `problem_members`):"]
    for r in problems.head(limit).iter_rows(named=True):
        lines.append(textwrap.fill(f"{r['severity'].upper()} [{r['team']}] {r['title']}", width=110, initial_indent="  ",
                                   subsequent_indent="      "))
        lines.append(textwrap.fill(f"what to do: {r['action']}", width=110, initial_indent="      ", subsequent_indent="        "))
        lines.append(textwrap.fill(f"why {r['team']}: {r['team_reason']}", width=110, initial_indent="      ",
                                   subsequent_indent="        "))
        lines.append(f"      evidence: {r['n_verdicts']} finding(s) from {r['detectors']}; jobs {r['job_ids'] or '-'}")
    if problems.height > limit:
        lines.append(f"  ... and {problems.height - limit} more (`fleetscope sql \"SELECT * FROM problems\"`)")
    return "\n".join(lines)


def problems_markdown(problems: pl.DataFrame, links: dict[str, list[str]] | None = None) -> str:
    """One section per problem: title, who and why, what to do, where to look, every piece of evidence."""
    import json

    if problems.height == 0:
        return "_No warning or critical findings._\n"
    md = []
    for r in problems.iter_rows(named=True):
        md += [f"### {r['severity'].upper()}: {r['title']}", "",
               f"- **team**: {r['team']} ({r['team_reason']})",
               f"- **what to do**: {r['action']}",
               f"- **subject**: {r['subject']}" + (f"; host `{r['host']}`" if r.get("host") else "") +
               (f", GPU `{r['gpu']}`" if r.get("gpu") else "") + (f", address `{r['ip']}`" if r.get("ip") else "") +
               (f", switch `{r['switch']}`" if r.get("switch") else ""),
               (f"- **when**: {_ts(r['start_ns'])} .. {_ts(r['end_ns'])} UTC; jobs: {r['job_ids'] or '-'}" if r["start_ns"] is not None
                else f"- **when**: not known (the finding carries no time); jobs: {r['job_ids'] or '-'}"),
               f"- **evidence** ({r['n_verdicts']} findings; metrics {r['metrics']}; "
               f"`fleetscope sql \"SELECT v.* FROM problem_members m JOIN anomaly_verdicts v USING (verdict_id) WHERE m.problem_id = '{r['problem_id']}'\"`):"]
        md += [f"  - {line}" for line in json.loads(r["evidence"])]
        for link in (links or {}).get(r["problem_id"], []):
            md.append(f"- {link}")
        md.append("")
    return "\n".join(md) + "\n"


def step_trend_plot(steps: pl.DataFrame, max_jobs: int = 8, markers: pl.DataFrame | None = None) -> bytes | None:
    """Step duration over time per job (median over the job's GPUs per step); problems about a job
    are marked on its line where they start (markers: job_id, start_ns, severity)."""
    if "start_observed" in steps.columns:
        steps = steps.filter(pl.col("start_observed"))
    if steps.height == 0:
        return None
    per = (steps.with_columns(d=(pl.col("end_ns") - pl.col("start_ns")) / 1e9)
           .group_by("job_id", "window_id", "step").agg(t=pl.col("end_ns").median(), d=pl.col("d").median()).sort("t"))
    jobs = per.group_by("job_id").len().sort("len", descending=True)["job_id"].head(max_jobs).to_list()
    fig, ax = plt.subplots(figsize=(9, 3.6))
    t0 = per["t"].min()
    for j in jobs:
        g = per.filter(pl.col("job_id") == j)
        line, = ax.plot((g["t"] - t0).to_numpy() / 1e9, g["d"].to_numpy(), ".-", ms=3, lw=0.8, label=j)
        if markers is not None and markers.height:
            for m in markers.filter((pl.col("job_id") == j) & pl.col("start_ns").is_not_null()).iter_rows(named=True):
                ax.axvline((m["start_ns"] - t0) / 1e9, color=line.get_color(), ls="--" if m["severity"] == "warning" else "-",
                           lw=1.2, alpha=0.8)
    ax.set_xlabel(f"seconds since {_ts(t0)} UTC")
    ax.set_ylabel("step time (s)")
    ax.set_title("step-time trend per job (reconstructed from flows)")
    ax.legend(fontsize=7, ncol=2)
    return _png(fig)


def switch_heatmap(flows: pl.DataFrame, bin_s: int = 10, max_switches: int = 40) -> bytes | None:
    """Achieved bandwidth of flows through each switch per time bin, relative to the switch's own
    best bin (1.0 = as fast as it gets): a congested switch shows as a dark band."""
    if flows.height == 0 or "path" not in flows.columns:
        return None
    f = flows.filter(pl.col("path").is_not_null() & (pl.col("duration_ns") > 0) & (pl.col("bytes") > 1 << 16))
    if f.height == 0:
        return None
    f = f.with_columns(bw=pl.col("bytes") / pl.col("duration_ns"), bin=(pl.col("start_ns") // (bin_s * 1_000_000_000)))
    sw = f.select("bw", "bin", "path").explode("path").group_by("path", "bin").agg(bw=pl.col("bw").median())
    sw = sw.with_columns(rel=pl.col("bw") / pl.col("bw").max().over("path"))
    worst = sw.group_by("path").agg(m=pl.col("rel").min()).sort("m")["path"].head(max_switches).to_list()
    sw = sw.filter(pl.col("path").is_in(worst))
    bins = sorted(sw["bin"].unique().to_list())
    grid = np.full((len(worst), len(bins)), np.nan)
    bi = {b: i for i, b in enumerate(bins)}
    si = {s: i for i, s in enumerate(worst)}
    for s, b, r in sw.select("path", "bin", "rel").iter_rows():
        grid[si[s], bi[b]] = r
    fig, ax = plt.subplots(figsize=(9, 0.25 * len(worst) + 1.5))
    im = ax.imshow(grid, aspect="auto", cmap="RdYlGn", vmin=0.3, vmax=1.0, interpolation="nearest")
    ax.set_yticks(range(len(worst)), worst, fontsize=7)
    ax.set_xlabel(f"time bin ({bin_s} s)")
    ax.set_title("switch bandwidth vs its own best bin (worst switches first)")
    fig.colorbar(im, ax=ax, fraction=0.03)
    return _png(fig)


def issue_latency_cdf(timings: pl.DataFrame, max_captures: int = 8) -> bytes | None:
    """CDF of kernel-issue latency (kernel start minus CPU issue) per capture (XPUTimer)."""
    if timings.height == 0:
        return None
    k = timings.filter((pl.col("kind") == "kernel") & (pl.col("start_ns") >= pl.col("issue_ns")))
    if k.height == 0:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for cap in k["capture_id"].unique().sort().head(max_captures).to_list():
        lat = np.sort((k.filter(pl.col("capture_id") == cap).select(pl.col("start_ns") - pl.col("issue_ns")).to_series().to_numpy()) / 1e3)
        ax.plot(lat, np.arange(1, len(lat) + 1) / len(lat), lw=1, label=cap)
    ax.set_xscale("symlog")
    ax.set_xlabel("kernel issue latency (us)")
    ax.set_ylabel("CDF")
    ax.set_title("kernel-issue latency per capture")
    ax.legend(fontsize=7)
    return _png(fig)


def incident_report(request: dict, verdicts: pl.DataFrame, problems: pl.DataFrame, steps: pl.DataFrame,
                    flows: pl.DataFrame, timings: pl.DataFrame) -> tuple[str, dict[str, bytes]]:
    """A person's view of one incident request: scope, timeline, verdicts in scope (grouped),
    plots. All inputs already filtered to the incident's scope by the caller."""
    plots = {k: v for k, v in {
        "step_trend.png": step_trend_plot(steps), "switch_heatmap.png": switch_heatmap(flows),
        "issue_latency_cdf.png": issue_latency_cdf(timings)}.items() if v is not None}
    v = verdicts
    md = [f"# Incident {request.get('incident_id')}: {request.get('kind', '?')}",
          "", f"- job: `{request.get('job_id') or '-'}`  hosts: {', '.join(request.get('hosts') or []) or '-'}  ips: {', '.join(request.get('ips') or []) or '-'}",
          f"- time span: {_ts(request.get('from_ns'))} .. {_ts(request.get('to_ns'))} UTC",
          f"- note: {request.get('note') or '-'}", "",
          f"## Problems ({problems.height}, from {v.height} findings; the cause first)", "", problems_markdown(problems)]
    md += ["## Timeline (UTC, in time order)", ""]
    tl = v.sort("start_ns", nulls_last=True).with_columns(when=pl.col("start_ns").map_elements(_ts, return_dtype=pl.Utf8))
    md.append(md_table(tl, ["when", "severity", "team", "detector", "scope", "subject", "explanation"], n=40))
    if "start_observed" in steps.columns:
        steps = steps.filter(pl.col("start_observed"))
    if steps.height:
        per = steps.with_columns(d=(pl.col("end_ns") - pl.col("start_ns")) / 1e6).group_by("job_id").agg(
            steps=pl.col("step").n_unique(), median_ms=pl.col("d").median().round(1), p95_ms=pl.col("d").quantile(0.95).round(1))
        md += ["## Step times in scope", "", md_table(per, ["job_id", "steps", "median_ms", "p95_ms"])]
    for name in plots:
        md.append(f"![{name}]({name})")
    if v.height == 0:
        md.append("\nNo verdicts in scope: nothing abnormal was found for this job / these hosts in this time span.")
    return "\n".join(md) + "\n", plots


def fleet_report(day: str, jobs: pl.DataFrame, steps: pl.DataFrame, verdicts: pl.DataFrame, problems: pl.DataFrame,
                 flows: pl.DataFrame, timings: pl.DataFrame, topology: pl.DataFrame | None = None,
                 links: dict[str, list[str]] | None = None) -> tuple[str, dict[str, bytes]]:
    """The fleet health page: open problems first (what to do, whose, evidence), then jobs and their
    step-time trends with the problems marked, recurring machines and switches, and plots."""
    markers = problems.with_columns(job_id=pl.col("job_ids").str.split(",")).explode("job_id") \
        .select("job_id", "start_ns", "severity") if problems.height else None
    plots = {k: v for k, v in {
        "step_trend.png": step_trend_plot(steps, markers=markers), "switch_heatmap.png": switch_heatmap(flows),
        "issue_latency_cdf.png": issue_latency_cdf(timings)}.items() if v is not None}
    n_jobs = jobs["job_id"].n_unique() if jobs.height else 0
    md = [f"# fleetscope fleet health: {day[:4]}-{day[4:6]}-{day[6:]}", ""]
    if problems.height:
        sev_team = problems.group_by("severity", "team").len().sort(pl.col("severity").replace_strict(_SEV, default=3), "team")
        md += [f"**{problems.height} open problem(s)**: " + ", ".join(f"{n} {s} for {tm}" for s, tm, n in sev_team.iter_rows()), ""]
    else:
        md += ["**No open problems**: no warning or critical finding.", ""]
    md += [f"- jobs seen: {n_jobs}; windows analysed: {jobs['window_id'].n_unique() if jobs.height else 0}; findings: "
           f"{verdicts.height} ({verdicts.filter(pl.col('severity') != 'info').height} warning/critical)", ""]
    md += ["## Open problems (one per cause, most severe first)", "", problems_markdown(problems, links)]
    if steps.height:
        # a window's first step per GPU has no observed start (it began before the flows did)
        full = steps.filter(pl.col("start_observed")) if "start_observed" in steps.columns else steps
        trend = (full.with_columns(d=(pl.col("end_ns") - pl.col("start_ns")) / 1e6).sort("end_ns")
                 .group_by("job_id").agg(steps=pl.col("step").n_unique(), median_ms=pl.col("d").median().round(1),
                                         first_ms=pl.col("d").head(20).median().round(1), last_ms=pl.col("d").tail(20).median().round(1))
                 .with_columns(trend_pct=((pl.col("last_ms") / pl.col("first_ms") - 1) * 100).round(1)).sort("trend_pct", descending=True))
        if problems.height:
            per_job = problems.with_columns(job_id=pl.col("job_ids").str.split(",")).explode("job_id").group_by("job_id").agg(
                problems=pl.col("title").str.join(" / "))
            trend = trend.join(per_job, on="job_id", how="left")
        md += ["## Jobs and their step-time trends", "", "![step_trend.png](step_trend.png)", "",
               md_table(trend, ["job_id", "steps", "median_ms", "first_ms", "last_ms", "trend_pct", "problems"], n=50)]
    rec = verdicts.filter(pl.col("scope").is_in(["switch", "host", "gpu", "link"]) & (pl.col("severity") != "info"))
    if rec.height:
        topo = topology.unique("ip", keep="last") if topology is not None and topology.height else None
        if topo is not None:
            rec = rec.join(topo.select(pl.col("ip").alias("subject"), pl.col("host").alias("on_host")), on="subject", how="left")
        else:
            rec = rec.with_columns(on_host=pl.lit(None, pl.Utf8))
        rec = rec.group_by("scope", "subject").agg(on_host=pl.col("on_host").first(), times=pl.len(),
                                                    windows=pl.col("window_id").n_unique(),
                                                    detectors=pl.col("detector").unique().sort().str.join(",")) \
            .filter(pl.col("windows") >= 2).sort("times", descending=True)
    md += ["## Machines and switches that recur (findings in two or more windows)", "",
           md_table(rec, ["scope", "subject", "on_host", "times", "windows", "detectors"])]
    md += [f"![{name}]({name})" for name in plots if name != "step_trend.png"]
    return "\n".join(md) + "\n", plots
