"""Group verdicts about the same problem into problems (an incident is a request someone files;
a problem is what the verdicts found).

Several detectors see one problem from different sides: a congested switch shows up as a switch
verdict (flows), as slower steps of the jobs crossing it (flows, timings) and as lower bus
bandwidth of their DP collectives (XPUTimer). Verdicts are linked when they share an entity (the
same job, switch, host, gpu/ip or rank of a job) and their time spans overlap (with slack); each
connected component is one problem. Ids are hashes of the member verdict ids, so the same input
gives the same problems."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pandera.polars as pa
import polars as pl
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from fleetscope.schemas.base import conform

PROBLEMS = pa.DataFrameSchema({
    "problem_id": pa.Column(pl.Utf8, unique=True),
    "title": pa.Column(pl.Utf8),
    "severity": pa.Column(pl.Utf8, pa.Check.isin(["info", "warning", "critical"])),
    "teams": pa.Column(pl.Utf8),
    "detectors": pa.Column(pl.Utf8),
    "job_ids": pa.Column(pl.Utf8, nullable=True),
    "subjects": pa.Column(pl.Utf8),
    "n_verdicts": pa.Column(pl.Int64, pa.Check.ge(1)),
    "start_ns": pa.Column(pl.Int64, nullable=True),
    "end_ns": pa.Column(pl.Int64, nullable=True),
    "verdict_ids": pa.Column(pl.Utf8),
})

PROBLEM_MEMBERS = pa.DataFrameSchema({
    "problem_id": pa.Column(pl.Utf8), "verdict_id": pa.Column(pl.Utf8)})

_SEV = {"info": 0, "warning": 1, "critical": 2}


def _entities(v: pl.DataFrame, topology: pl.DataFrame | None, job_clusters: pl.DataFrame | None) -> pl.DataFrame:
    """(row, entity) pairs: what each verdict is about, widened through the topology (a gpu ip
    is also its host and its leaf switch) and job membership (an ip belongs to a job)."""
    base = v.select(pl.col("_row"), pl.concat_str([pl.col("scope"), pl.lit(":"), pl.col("subject")]).alias("entity"))
    ents = [base]
    ents.append(v.filter(pl.col("job_id").is_not_null()).select("_row", pl.concat_str([pl.lit("job:"), pl.col("job_id")]).alias("entity")))
    if topology is not None and topology.height:
        topo = topology.select("ip", "host", *[c for c in ("leaf",) if c in topology.columns]).unique("ip")
        gpu = v.filter(pl.col("scope").is_in(["gpu", "link"])).join(topo, left_on="subject", right_on="ip", how="inner")
        ents.append(gpu.select("_row", pl.concat_str([pl.lit("host:"), pl.col("host")]).alias("entity")))
        if "leaf" in topo.columns:
            ents.append(gpu.filter(pl.col("leaf").is_not_null()).select("_row", pl.concat_str([pl.lit("switch:"), pl.col("leaf")]).alias("entity")))
        if job_clusters is not None and job_clusters.height:
            jc = job_clusters.select("ip", "job_id").unique()
            ents.append(v.filter(pl.col("scope").is_in(["gpu", "link"])).join(jc, left_on="subject", right_on="ip", how="inner")
                        .select("_row", pl.concat_str([pl.lit("job:"), pl.col("job_id_right")]).alias("entity")))
    # switch verdicts name the jobs they slow in their evidence (when the detector recorded it)
    if "evidence" in v.columns:
        sw = v.filter(pl.col("evidence").is_not_null() & pl.col("evidence").str.contains('"jobs"'))
        rows = []
        for r, ev in zip(sw["_row"].to_list(), sw["evidence"].to_list()):
            try:
                for j in json.loads(ev).get("jobs", []) or []:
                    rows.append((r, f"job:{j}"))
            except (ValueError, AttributeError):
                continue
        if rows:
            ents.append(pl.DataFrame(rows, schema={"_row": pl.Int64, "entity": pl.Utf8}, orient="row"))
    return pl.concat(ents).unique()


def group_problems(verdicts: pl.DataFrame, topology: pl.DataFrame | None = None, job_clusters: pl.DataFrame | None = None,
                    min_severity: str = "warning", slack_ns: int = 120_000_000_000) -> tuple[pl.DataFrame, pl.DataFrame]:
    """-> (problems, members(problem_id, verdict_id))."""
    v = verdicts.filter(pl.col("severity").replace_strict(_SEV, default=0) >= _SEV[min_severity])
    empty = conform(pl.DataFrame(), PROBLEMS), pl.DataFrame(schema={"problem_id": pl.Utf8, "verdict_id": pl.Utf8})
    if v.height == 0:
        return empty
    v = v.sort("verdict_id").with_row_index("_row").with_columns(pl.col("_row").cast(pl.Int64))
    ents = _entities(v, topology, job_clusters)
    # pairs of verdicts sharing an entity, kept when their time spans overlap within the slack
    pairs = ents.join(ents, on="entity", suffix="_b").filter(pl.col("_row") < pl.col("_row_b")).select("_row", "_row_b").unique()
    span = v.select("_row", pl.col("start_ns").fill_null(pl.col("end_ns")).alias("s"), pl.col("end_ns").fill_null(pl.col("start_ns")).alias("e"))
    pairs = pairs.join(span, on="_row").join(span.rename({"_row": "_row_b", "s": "s_b", "e": "e_b"}), on="_row_b")
    overlap = (pl.col("s").is_null() | pl.col("s_b").is_null()) | (
        (pl.col("s") <= pl.col("e_b") + slack_ns) & (pl.col("s_b") <= pl.col("e") + slack_ns))
    pairs = pairs.filter(overlap)
    n = v.height
    a, b = pairs["_row"].to_numpy(), pairs["_row_b"].to_numpy()
    graph = coo_matrix((np.ones(len(a)), (a, b)), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    v = v.with_columns(pl.Series("_comp", labels))
    out, members = [], []
    for _, g in v.group_by("_comp", maintain_order=True):
        ids = sorted(g["verdict_id"].to_list())
        iid = "prb-" + hashlib.sha1("\n".join(ids).encode()).hexdigest()[:12]
        worst = g.sort(pl.col("severity").replace_strict(_SEV, default=0), descending=True).row(0, named=True)
        title = f"{worst['scope']} {worst['subject']}: {worst['metric']}" + (f" (+{g.height - 1} related)" if g.height > 1 else "")
        out.append(dict(
            problem_id=iid, title=title, severity=worst["severity"],
            teams=",".join(sorted(set(g["team"].to_list()))), detectors=",".join(sorted(set(g["detector"].to_list()))),
            job_ids=",".join(sorted({j for j in g["job_id"].to_list() if j})) or None,
            subjects=",".join(sorted(set((g["scope"] + ":" + g["subject"]).to_list()))),
            n_verdicts=g.height, start_ns=g["start_ns"].min(), end_ns=g["end_ns"].max(), verdict_ids=",".join(ids)))
        members += [(iid, i) for i in ids]
    inc = PROBLEMS.validate(conform(pl.DataFrame(out, infer_schema_length=None), PROBLEMS))
    inc = inc.sort(pl.col("severity").replace_strict(_SEV, default=0), "n_verdicts", descending=[True, True])
    return inc, pl.DataFrame(members, schema={"problem_id": pl.Utf8, "verdict_id": pl.Utf8}, orient="row")
