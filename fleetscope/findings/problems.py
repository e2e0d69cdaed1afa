"""One problem per cause: the verdicts of every detector turned into what a person acts on.

Several detectors see one cause from different sides: a slow GPU shows as a slow rank (traces,
timings), as kernels abnormal on one worker (PerfTracker), as slower steps of its job and its
tensor-parallel peers' waiting (flows); a congested switch as low bandwidth through it and slower
steps of every job crossing it. So:

1. Every warning/critical verdict is resolved to the thing it is about, named as people name it:
   a GPU address becomes `host/gpu (ip)` through the topology; a rank of a capture becomes its host
   and GPU through the capture's rank map (timings' host column, the trace's device) and the
   topology; a capture's job is linked to the job recognized from flows on the same hosts.
2. Verdicts about an actionable subject (a GPU, NIC, host, switch, stage, function or kernel) are
   causes; verdicts about a job as a whole (slow steps, slow DP group) are symptoms.
3. Causes about the same subject, from any detector or window close in time, are one problem.
   Function and kernel findings confined to one GPU become evidence of that GPU's problem.
4. A switch is a cause when the jobs crossing it slow down together, when it slowed the flows of a
   job no other cause touches, or when nothing else explains its jobs' slowdown; otherwise its
   finding is evidence under the cause that does.
5. Symptoms attach to the cause in their job that explains them; a symptom nothing explains is a
   problem of its own ("job X is slow; the cause is not localized").
The team follows the cause (routing below, with the reason). A problem's id hashes its cause (the
subject key) and when that cause was first seen, not its members: it stays the same while new
evidence and symptoms join it, so a link to it survives the live rebuilds (fleetscope.jobs.planner)."""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import re

import pandera.polars as pa
import polars as pl

from fleetscope.ingest.windows import parse_window_id
from fleetscope.schemas.base import Table, conform

PROBLEMS = pa.DataFrameSchema({
    "problem_id": pa.Column(pl.Utf8, unique=True),
    "title": pa.Column(pl.Utf8),                    # one sentence a person understands
    "severity": pa.Column(pl.Utf8, pa.Check.isin(["info", "warning", "critical"])),
    "team": pa.Column(pl.Utf8, pa.Check.isin(["algorithm", "infrastructure", "operations"])),
    "team_reason": pa.Column(pl.Utf8),
    "cause": pa.Column(pl.Utf8),                    # gpu, nic, host, switch, rank, stage, code, job
    "subject": pa.Column(pl.Utf8),                  # what to act on, as people name it
    "host": pa.Column(pl.Utf8, nullable=True),
    "gpu": pa.Column(pl.Utf8, nullable=True),
    "ip": pa.Column(pl.Utf8, nullable=True),
    "switch": pa.Column(pl.Utf8, nullable=True),
    "action": pa.Column(pl.Utf8),                   # what to do
    "job_ids": pa.Column(pl.Utf8, nullable=True),
    "detectors": pa.Column(pl.Utf8),
    "metrics": pa.Column(pl.Utf8),                  # the technical metric names, kept apart from the title
    "n_verdicts": pa.Column(pl.Int64, pa.Check.ge(1)),
    "start_ns": pa.Column(pl.Int64, nullable=True),
    "end_ns": pa.Column(pl.Int64, nullable=True),
    "evidence": pa.Column(pl.Utf8),                 # JSON list: one line per member verdict, cause first
    "verdict_ids": pa.Column(pl.Utf8),
    # kept from the first version of this table
    "teams": pa.Column(pl.Utf8),
    "subjects": pa.Column(pl.Utf8),
})

PROBLEM_MEMBERS = pa.DataFrameSchema({
    "problem_id": pa.Column(pl.Utf8), "verdict_id": pa.Column(pl.Utf8),
    "role": pa.Column(pl.Utf8, pa.Check.isin(["cause", "evidence", "symptom"]))})

# rank -> host / device of a capture (fleetscope.ingest.captures writes it as capture_ranks)
_SEV = {"info": 0, "warning": 1, "critical": 2}
CAUSE_SCOPES = {"gpu": "gpu", "link": "nic", "host": "host", "switch": "switch", "rank": "rank", "stage": "stage",
                "function": "code", "kernel": "code"}
SYMPTOM_SCOPES = {"job", "step", "dp_group"}
# which cause is the better explanation when several touch a job (lower first)
_PRIORITY = {"gpu": 0, "rank": 1, "nic": 2, "host": 3, "stage": 4, "code": 5, "switch": 6, "job": 9}

# Routing: the team follows the cause. One place, with the reason a person reads.
ROUTING = {
    "operations": "hardware, network and hosts are run by operations (a GPU, NIC, link, switch or host misbehaves)",
    "algorithm": "the model, its parallel layout and the training script belong to the job's owners (user code and configuration)",
    "infrastructure": "framework, kernels and libraries are the platform's (the same code runs slow on healthy hardware)",
}
ACTIONS = {
    "gpu": "drain the host and check the GPU (clocks, temperature, ECC, power) before putting it back; the job can restart without it",
    "rank": "drain the host and check the GPU (clocks, temperature, ECC, power); if the hardware is healthy, look at that rank's input",
    "nic": "check the NIC, its cable and the switch port (error counters, link speed, flaps); move the job off the port",
    "host": "check the host (CPU load, memory, NICs, PCIe); drain it if it keeps coming back",
    "switch": "check the switch's ports and buffers (drops, ECN marks, link speeds) and the routing of the jobs across it",
    "stage": "rebalance the pipeline stages (move layers off the slow stage, or the embedding / loss)",
    "code": "look at this function in the job's code or framework version; compare with a healthy run of the same job",
    "job": "the job is slow but no single machine, link or stage explains it: profile it (a capture) or look at its own changes",
}
# job-level causes the job's owners fix in its launch, named by their own detector
JOB_CAUSES = {
    "flows.nic_overload": ("sends each host's traffic through one NIC",
                           "launch the job with every GPU NIC of its hosts (NCCL_IB_HCA / NCCL_SOCKET_IFNAME listing "
                           "them all, or unset); its collectives then use each host's full bandwidth"),
}
_SLACK_NS = 10 * 60 * 1_000_000_000   # findings about one subject this close in time are one problem


def short_name(name: str, limit: int = 60) -> str:
    """A kernel's or function's name people can read: C++ templates and argument lists dropped
    (`void cutlass::Kernel<cutlass::gemm::...>(Params)` -> `cutlass::Kernel`); the full name stays in
    the evidence."""
    s = name.strip()
    s = re.sub(r"^(void|static|__global__)\s+", "", s)
    out, depth = [], 0
    for ch in s:  # drop everything inside <...> and (...)
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    s = re.sub(r"\s+", " ", "".join(out)).strip() or name
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _utc(ns) -> str:
    return dt.datetime.fromtimestamp(int(ns) / 1e9, tz=dt.timezone.utc).strftime("%H:%M:%S") if ns is not None else "?"


def _headline(explanation: str) -> str:
    """The first statement of a detector's explanation (its finding, not its advice): up to the
    first '. ' or '; ' outside parentheses."""
    s, depth = explanation.strip(), 0
    for i, ch in enumerate(s):
        depth += ch in "([" and 1 or (-1 if ch in ")]" else 0)
        if depth == 0 and s[i:i + 2] in (". ", "; "):
            return s[:i]
    return s.rstrip(".")


def _gpu_col(topology: pl.DataFrame) -> pl.Expr:
    """The topology's GPU name (docs/CONTRACT.md 1.1: optional, the address when absent)."""
    return pl.col("gpu").fill_null(pl.col("ip")) if "gpu" in topology.columns else pl.col("ip").alias("gpu")


def link_captures_to_jobs(capture_ranks: pl.DataFrame, job_clusters: pl.DataFrame) -> dict[str, list[str]]:
    """capture_id -> the jobs recognized from flows on the same GPUs, the one holding most of the
    capture's addresses first. By address (capture_ranks resolved to addresses): the flow job holding
    most of them; else the flow jobs that lie within them and together hold most of them (a job whose
    pipeline and tensor-parallel traffic stays inside its hosts shows in the network as one job per
    replica ring: its parts). Else by host: the flow job holding all of the capture's hosts (two jobs
    on one host's two halves tie there)."""
    if capture_ranks.height == 0 or job_clusters.height == 0:
        return {}
    out: dict[str, list[str]] = {}
    if "ip" in capture_ranks.columns and "ip" in job_clusters.columns:
        caps = capture_ranks.filter(pl.col("ip").is_not_null()).select("capture_id", "ip").unique()
        fj = job_clusters.select("job_id", "ip").unique()
        j = (caps.join(fj, on="ip").group_by("capture_id", "job_id").agg(shared=pl.len())
             .join(caps.group_by("capture_id").agg(n=pl.len()), on="capture_id")
             .join(fj.group_by("job_id").agg(size=pl.len()), on="job_id")
             .sort(["shared", "job_id"], descending=[True, False]))
        for (cap,), g in j.group_by("capture_id", maintain_order=True):
            n = g["n"][0]
            if 2 * g["shared"][0] > n:
                out[cap] = g["job_id"][:1].to_list()
                continue
            parts = g.filter(2 * pl.col("shared") > pl.col("size"))   # flow jobs mostly inside the capture
            if 2 * parts["shared"].sum() > n:
                out[cap] = parts["job_id"].to_list()
    if "host" not in job_clusters.columns:
        return out
    caps = capture_ranks.filter(pl.col("host").is_not_null()).select("capture_id", "host").unique()
    jobs = job_clusters.filter(pl.col("host").is_not_null()).select("job_id", "host").unique()
    j = caps.join(jobs, on="host").group_by("capture_id", "job_id").agg(pl.len().alias("shared"))
    need = caps.group_by("capture_id").agg(pl.len().alias("hosts"))
    # ties (flow jobs are recognized per window: several ids may hold all the hosts) go to the first
    # id, so the same tables give the same answer whatever order they were read in
    best = j.join(need, on="capture_id").filter(pl.col("shared") == pl.col("hosts")) \
        .sort(["shared", "job_id"], descending=[True, False]).unique("capture_id", keep="first", maintain_order=True)
    return {**{c: [jb] for c, jb in best.select("capture_id", "job_id").iter_rows()}, **out}


def resolve_ranks(capture_ranks: pl.DataFrame, topology: pl.DataFrame) -> pl.DataFrame:
    """capture_ranks (capture_id, rank, host, device) -> + gpu, ip from the topology: the host's GPUs in
    their natural order (rail when the topology has it), the device index picking one."""
    schema = {"capture_id": pl.Utf8, "rank": pl.Int64, "host": pl.Utf8, "gpu": pl.Utf8, "ip": pl.Utf8}
    if capture_ranks.height == 0:
        return pl.DataFrame(schema=schema)
    cr = capture_ranks.with_columns(pl.col("rank").cast(pl.Int64))
    if topology.height == 0 or "device" not in cr.columns:
        return cr.with_columns(gpu=pl.lit(None, pl.Utf8), ip=pl.lit(None, pl.Utf8)).select(list(schema))
    # the host's GPUs in device order: by rail, else by the number in the GPU's name (gpu10 after gpu9),
    # else as the topology lists them (an address sorts by no device order: 10.0.0.6 after 10.0.0.58)
    # (the number in the GPU's own name, not in the address standing in for a missing one)
    gi = pl.when(pl.col("gpu") != pl.col("ip")).then(pl.col("gpu").str.extract(r"(\d+)\D*$", 1).cast(pl.Int64, strict=False)) \
        if "gpu" in topology.columns else pl.lit(None, pl.Int64)
    t = topology.with_row_index("_row").select("host", "ip", _gpu_col(topology), "_row", _gi=gi,
                                               *(["rail"] if "rail" in topology.columns else []))
    order = ["rail", "_gi", "_row"] if "rail" in topology.columns else ["_gi", "_row"]
    t = t.sort(*order, nulls_last=True).with_columns(device=pl.int_range(pl.len()).over("host").cast(pl.Int64))
    out = cr.with_columns(pl.col("device").cast(pl.Int64)).join(t.select("host", "device", "gpu", "ip"), on=["host", "device"], how="left")
    return out.select(list(schema))


def _resolve(v: pl.DataFrame, topology: pl.DataFrame, ranks: pl.DataFrame, cap_job: dict[str, list[str]],
             ips_of_job: dict[str, set]) -> list[dict]:
    """Per verdict: its cause family and key, the names people use, and its (flow) job: `flow_job`
    the one it names (a capture's rank: the flow job holding the rank's address), `flow_jobs` every
    flow job it is about (a capture's job may show in flows as several)."""
    topo = {r["ip"]: r for r in topology.select("ip", "host", _gpu_col(topology),
                                                 *(["leaf"] if "leaf" in topology.columns else [])).iter_rows(named=True)} \
        if topology.height else {}
    rank_of = {(r["capture_id"], r["rank"]): r for r in ranks.iter_rows(named=True)}
    rows = []
    for r in v.iter_rows(named=True):
        d = dict(r)
        cap = r.get("capture_id")
        parts = cap_job.get(cap) if cap else None
        job = parts[0] if parts else r.get("job_id")
        d["flow_job"], d["flow_jobs"] = job, (set(parts) if parts else {job} - {None})
        d["host"] = d["gpu"] = d["ip"] = d["switch"] = None
        d["ranks"] = []
        try:
            ev = json.loads(r["evidence"]) if r.get("evidence") else {}
        except ValueError:
            ev = {}
        d["ev"] = ev if isinstance(ev, dict) else {}
        scope, subj = r["scope"], r["subject"]
        if scope in SYMPTOM_SCOPES:
            d["family"], d["key"] = "job", f"job:{job}"
        elif scope in ("gpu", "link"):
            t = topo.get(subj, {})
            d.update(host=t.get("host"), gpu=t.get("gpu"), ip=subj, switch=t.get("leaf"))
            d["family"], d["key"] = CAUSE_SCOPES[scope], f"{CAUSE_SCOPES[scope]}:{subj}"
        elif scope == "host":
            d.update(host=subj)
            d["family"], d["key"] = "host", f"host:{subj}"
        elif scope == "switch":
            d.update(switch=subj)
            d["family"], d["key"] = "switch", f"switch:{subj}"
        elif scope == "rank":
            m = rank_of.get((cap, int(subj))) if subj.lstrip("-").isdigit() else None
            d["ranks"] = [subj]
            if m and m.get("ip"):
                d.update(host=m["host"], gpu=m["gpu"], ip=m["ip"])
                d["family"], d["key"] = "gpu", f"gpu:{m['ip']}"
                d["flow_job"] = next((jb for jb in sorted(d["flow_jobs"]) if m["ip"] in ips_of_job.get(jb, ())), job)
            elif m and m.get("host"):
                d.update(host=m["host"])
                d["family"], d["key"] = "rank", f"rank:{cap}:{subj}"
            else:
                d["family"], d["key"] = "rank", f"rank:{cap}:{subj}"
        elif scope == "stage":
            d["family"], d["key"] = "stage", f"stage:{job}:{subj}"
        else:  # function / kernel: on one GPU only, it is that GPU's evidence
            d["family"], d["key"] = "code", f"code:{job}:{subj}"
            rk = d["ev"].get("ranks") or d["ev"].get("workers")
            if isinstance(rk, list) and 0 < len(rk) <= 1 and cap is not None:
                m = rank_of.get((cap, int(rk[0]))) if str(rk[0]).lstrip("-").isdigit() else None
                d["ranks"] = [str(x) for x in rk]
                if m and m.get("ip"):
                    d.update(host=m["host"], gpu=m["gpu"], ip=m["ip"], family="gpu", key=f"gpu:{m['ip']}", evidence_only=True)
        rows.append(d)
    return rows


def _label(c: dict) -> str:
    fam = c["family"]
    gpu = c.get("gpu") if c.get("gpu") and c.get("gpu") != c.get("ip") else None
    where = f"{gpu} ({c['ip']})" if gpu else (f"{c['host']} ({c['ip']})" if c.get("host") and c.get("ip") else c.get("ip"))
    if fam == "gpu":
        extra = f", rank {c['ranks'][0]} of job {c['flow_job']}" if c.get("ranks") and c.get("flow_job") else ""
        return f"GPU {where or c['subject']}{extra}"
    if fam == "nic":
        # a NIC whose leaf carries no flows but its own (the leaf's other ports idle) is one segment with
        # its leaf for the flows: NIC, cable, port and switch slow the same flows alike, and whichever of
        # them is named alone is a guess (demo seeds 813, 816, 819: a congested leaf over one busy NIC)
        alts = (c.get("ev") or {}).get("or_equally") or []
        leaf = f" or its switch {c['switch']}" if c.get("switch") and c["switch"] in alts else ""
        return f"NIC of {where or c['subject']}{leaf}"
    if fam == "host":
        return f"host {c['host']}"
    if fam == "switch":
        return f"switch {c['switch']}"
    if fam == "rank":
        on = f" on host {c['host']}" if c.get("host") else ""
        return f"rank {c['subject']} of job {c['flow_job']}{on}"
    if fam == "stage":
        return f"pipeline stage {c['subject']} of job {c['flow_job']}"
    if fam == "code":
        return f"{short_name(c['subject'])} in job {c['flow_job']}"
    return f"job {c['flow_job']}"


def _evidence_line(d: dict) -> str:
    subj = d["subject"]  # the full name here (a kernel's template arguments tell its shape); titles use short_name
    nums = ""
    if d.get("value") is not None:
        nums = f" [{d['metric']} {d['value']:.4g}" + (f" vs {d['baseline']:.4g}" if d.get("baseline") is not None else "") + "]"
    when = f"at {_utc(d['start_ns'])} UTC" if d.get("start_ns") is not None else "(time not known)"
    return f"{d['severity']} {d['detector']} {d['scope']} {subj} {when}: {d['explanation']}{nums}"


def group_problems(verdicts: pl.DataFrame, topology: pl.DataFrame | None = None, job_clusters: pl.DataFrame | None = None,
                   capture_ranks: pl.DataFrame | None = None, min_severity: str = "warning") -> tuple[pl.DataFrame, pl.DataFrame]:
    """-> (problems, problem_members)."""
    topology = topology if topology is not None else pl.DataFrame()
    if topology.height:
        topology = topology.unique("ip", keep="last", maintain_order=True)
    job_clusters = job_clusters if job_clusters is not None else pl.DataFrame()
    capture_ranks = capture_ranks if capture_ranks is not None else pl.DataFrame()
    members_empty = pl.DataFrame(schema={c: col.dtype.type for c, col in PROBLEM_MEMBERS.columns.items()})
    v = verdicts.filter(pl.col("severity").replace_strict(_SEV, default=0) >= _SEV[min_severity]) if verdicts.height else verdicts
    if v.height == 0:
        return conform(pl.DataFrame(), PROBLEMS), members_empty
    for c in ("capture_id", "evidence", "window_id"):
        if c not in v.columns:
            v = v.with_columns(pl.lit(None, pl.Utf8).alias(c))
    ranks = resolve_ranks(capture_ranks, topology)
    with_ip = capture_ranks.with_columns(pl.col("rank").cast(pl.Int64)).join(
        ranks.select("capture_id", "rank", "ip"), on=["capture_id", "rank"], how="left") if ranks.height else capture_ranks
    cap_job = link_captures_to_jobs(with_ip, job_clusters)
    ips_of_job, hosts_of_job = {}, {}
    if job_clusters.height:
        for j, ip in job_clusters.select("job_id", "ip").unique().iter_rows():
            ips_of_job.setdefault(j, set()).add(ip)
        if "host" in job_clusters.columns:
            for j, h in job_clusters.select("job_id", "host").drop_nulls().unique().iter_rows():
                hosts_of_job.setdefault(j, set()).add(h)
    rows = _resolve(v.sort("verdict_id"), topology, ranks, cap_job, ips_of_job)
    # when each flow job's steps ran slower than usual (sustained, any severity): see _slow_alone
    slow_spans: dict[str, list[tuple[int, int]]] = {}
    for j, a, b in verdicts.filter((pl.col("detector") == "flows.cross_step") & pl.col("start_ns").is_not_null()) \
            .select("job_id", "start_ns", pl.coalesce("end_ns", "start_ns")).iter_rows():
        slow_spans.setdefault(j, []).append((a, b))

    # causes: one cluster per subject key, split where findings are far apart in time
    causes: list[dict] = []
    by_key: dict[str, list[dict]] = {}
    for d in rows:
        if d["family"] != "job":
            by_key.setdefault(d["key"], []).append(d)
    # (a finding with no time, a capture's, joins the subject's first cluster: its time is not known,
    # not the epoch)
    for key, ds in by_key.items():
        ds.sort(key=lambda d: (d.get("start_ns") is not None, d.get("start_ns") or 0))
        cur = None
        for d in ds:
            s = d.get("start_ns")
            if cur is None or (s is not None and cur["end"] is not None and s > cur["end"] + _SLACK_NS):
                cur = {"key": key, "members": [], "end": None}
                causes.append(cur)
            cur["members"].append(d)
            if s is not None:
                cur["end"] = max(x for x in (cur["end"], d.get("end_ns") or s) if x is not None)
    for c in causes:
        real = [d for d in c["members"] if not d.get("evidence_only")] or c["members"]
        c["lead"] = max(real, key=lambda d: (_SEV[d["severity"]], abs((d.get("value") or 1) - (d.get("baseline") or 1))))
        c["family"] = c["lead"]["family"] if not c["lead"].get("evidence_only") else "gpu"
        c["jobs"] = set().union(*(d["flow_jobs"] for d in c["members"]))
        if c["family"] == "switch":
            for d in c["members"]:
                c["jobs"] |= set(d["ev"].get("jobs") or [])
        if c["family"] in ("gpu", "nic") and c["lead"].get("ip"):
            c["jobs"] |= {j for j, ips in ips_of_job.items() if c["lead"]["ip"] in ips}
        c["start_ns"] = min((d.get("start_ns") for d in c["members"] if d.get("start_ns") is not None), default=None)
        c["end_ns"] = max((d.get("end_ns") for d in c["members"] if d.get("end_ns") is not None), default=c["start_ns"])

    # a host or NIC the flows single out (its rings slowed, which a slow GPU does too) while a GPU of it,
    # or of a host or NIC the flows cannot tell it from (the same slow flows, or the same rings slowed
    # as a whole), is a cause at the same time: evidence of that GPU's problem
    def _flow_places(c: dict) -> set:
        det = {"host": "flows.late_rank", "nic": "flows.nic_bandwidth"}.get(c["family"])
        if det is None or not all(d["detector"] == det for d in c["members"]):
            return set()
        ev = c["lead"]["ev"]
        return {c["lead"].get("host") if c["family"] == "host" else c["lead"].get("ip"),
                *(ev.get("or_equally") or []), *(ev.get("or_in_its_rings") or [])} - {None}

    # ... and a NIC of the slow GPU's own host, on its job: a GPU that computes slowly holds back its
    # tensor-parallel group, every rank of the host, and so the flows of every NIC of the host
    host_of = dict(zip(topology["ip"].to_list(), topology["host"].to_list())) \
        if topology.height and "host" in topology.columns else {}

    def _same_host_nic(o: dict, c: dict, places: set) -> bool:
        return c["family"] == "nic" and o["lead"].get("host") is not None and bool(o["jobs"] & c["jobs"]) \
            and o["lead"]["host"] in {host_of.get(p) for p in places}

    absorbed = set()
    for i, c in enumerate(causes):
        places = _flow_places(c)
        g = next((o for o in causes if o["family"] == "gpu" and ({o["lead"].get("host"), o["lead"].get("ip")} & places
                                                                  or _same_host_nic(o, c, places))
                  and _overlaps(o, c)), None) if places else None
        if g is not None:
            for d in c["members"]:
                d["evidence_only"] = True
            g["members"] += c["members"]
            g["jobs"] |= c["jobs"]
            absorbed.add(i)
    causes = [c for i, c in enumerate(causes) if i not in absorbed]
    causes = _onsets_into_switches(causes)

    # a GPU or NIC finding on a host that is itself flagged at the same time: the host is the cause
    host_cause = {c["lead"]["host"]: c for c in causes if c["family"] == "host"}
    merged = []
    for c in causes:
        h = host_cause.get(c["lead"].get("host")) if c["family"] in ("gpu", "nic") else None
        if h is not None and _overlaps(c, h):
            _join(h, c)
            continue
        merged.append(c)
    causes = merged

    rails = _rails(topology)

    # symptoms: attach each to the best cause in its job overlapping in time
    symptoms = [d for d in rows if d["family"] == "job"]
    explained: dict[int, list[dict]] = {}
    orphans = []
    def _hosts(jobs: set) -> set:
        return set().union(*(hosts_of_job.get(j, set()) for j in jobs)) if jobs else set()

    for s in symptoms:
        cands = [i for i, c in enumerate(causes) if s["flow_jobs"] & c["jobs"] and _overlaps(s, c)]
        # ... else a cause of a job on the same hosts: the flows see one job in pieces where some of its
        # ranks talk only among themselves (a pipeline hop inside a leaf), and a piece slows with the
        # rest of its job, with nothing of its own to show why
        if not cands and s["detector"] not in JOB_CAUSES and _hosts(s["flow_jobs"]):
            cands = [i for i, c in enumerate(causes) if _hosts(c["jobs"]) & _hosts(s["flow_jobs"]) and _overlaps(s, c)]
        if not cands or s["detector"] in JOB_CAUSES:   # the job's own launch: a cause of its own
            orphans.append(s)
            continue
        best = min(cands, key=lambda i: (_PRIORITY.get(causes[i]["family"], 8), -_SEV[causes[i]["lead"]["severity"]]))
        explained.setdefault(best, []).append(s)

    # a switch is a cause when the jobs crossing it slow together, or when nothing else explains its jobs
    demoted: dict[int, int] = {}
    for i, c in enumerate(causes):
        if c["family"] != "switch":
            continue
        slow_jobs = {s["flow_job"] for s in symptoms if s["flow_jobs"] & c["jobs"] and _overlaps(s, c)}
        # (the flows' own localization already weighed the switch against NICs and hosts: only another
        # source's cause, a slow GPU in the traces, can take its place)
        # ... and only one whose rings cross it: a slow GPU paces the rings of its own rail, never a
        # switch of another rail (a rail-optimized fabric: a leaf or spine carries one rail's rings)
        others = [k for k, o in enumerate(causes) if k != i and o["family"] not in ("switch", "code")
                  and not all(d["detector"].startswith("flows.") for d in o["members"])
                  and o["jobs"] & c["jobs"] and _overlaps(o, c) and _may_pace(o, c, rails)]
        # ... and a switch that slowed the flows of a job no other cause touches has evidence of its own
        covered = set().union(*(causes[k]["jobs"] for k in others)) if others else set()
        if len(slow_jobs) < 2 and others and c["jobs"] <= covered and not _slow_alone(c, slow_spans):
            host = min(others, key=lambda k: _PRIORITY.get(causes[k]["family"], 8))
            demoted[i] = host
            explained.setdefault(host, []).extend(explained.pop(i, []))

    out, members = [], []
    for i, c in enumerate(causes):
        if i in demoted:
            continue
        ev_members = list(c["members"])
        extra = [m for k, h in demoted.items() if h == i for m in causes[k]["members"]]
        sym = explained.get(i, [])
        out.append(_problem(c, ev_members, extra, sym, demoted_switches=[causes[k] for k, h in demoted.items() if h == i]))
        members += [(out[-1]["problem_id"], d["verdict_id"], "cause" if d is c["lead"] else "evidence") for d in ev_members + extra]
        members += [(out[-1]["problem_id"], d["verdict_id"], "symptom") for d in sym]
    for job, ss in _group_orphans(orphans).items():
        lead = max(ss, key=lambda d: (d["detector"] in JOB_CAUSES, _SEV[d["severity"]], d.get("value") or 0))
        c = {"key": f"job:{job}", "members": ss, "lead": lead, "family": "job", "jobs": {job},
             "start_ns": min((d.get("start_ns") for d in ss if d.get("start_ns") is not None), default=None)}
        out.append(_problem(c, ss, [], [], demoted_switches=[]))
        members += [(out[-1]["problem_id"], d["verdict_id"], "cause" if d is lead else "symptom") for d in ss]
    problems = PROBLEMS.validate(conform(pl.DataFrame(out, infer_schema_length=None), PROBLEMS))
    problems = problems.sort(pl.col("severity").replace_strict(_SEV, default=0), "n_verdicts", descending=[True, True])
    return problems, PROBLEM_MEMBERS.validate(pl.DataFrame(members, schema=["problem_id", "verdict_id", "role"], orient="row"))


def _rails(topology: pl.DataFrame) -> dict[str, set]:
    """The rails of each switch, address and host (topology's `rail` per address; empty without it)."""
    if not topology.height or "rail" not in topology.columns:
        return {}
    out: dict[str, set] = {}
    keys = [c for c in ("ip", "host", "leaf", "spine") if c in topology.columns]
    for row in topology.filter(pl.col("rail").is_not_null()).select(*keys, "rail").iter_rows(named=True):
        for k in keys:
            if row[k] is not None:
                out.setdefault(str(row[k]), set()).add(row["rail"])
    return out


def _join(into: dict, c: dict) -> None:
    """Cause c's findings, jobs and first time joined into cause `into` (one problem from here on)."""
    into["members"] += c["members"]
    into["jobs"] |= c["jobs"]
    if c["start_ns"] is not None:
        into["start_ns"] = c["start_ns"] if into["start_ns"] is None else min(into["start_ns"], c["start_ns"])


def _windows(c: dict) -> list[tuple[int, int]]:
    """The analysis windows (start_ns, end_ns) of a cause's findings; [] when one has none."""
    out = []
    for d in c["members"]:
        try:
            out.append(parse_window_id(d.get("window_id") or ""))
        except ValueError:
            return []
    return out


def _onsets_into_switches(causes: list[dict]) -> list[dict]:
    """A NIC the flows named only in the window just before a switch's first, that the switch's findings
    list among the elements they cannot tell it from (its rings', or its equals), on the same jobs, is the
    switch's onset: a window that saw only its first seconds pinned them on one NIC of a ring crossing it,
    and the next window, seeing all of it, named the switch with that NIC in its rings (demo seeds 671,
    679: a congested spine from 12:00:52 named at 12:01 after a NIC of its rings at 12:00:51). It joins
    the switch's problem as evidence."""
    absorbed = set()
    for c in causes:
        if c["family"] != "switch" or not (win := _windows(c)):
            continue
        first = min(win)
        places = set()
        for d in c["members"]:
            if d["detector"] == "flows.switch_bandwidth":
                places |= set(d["ev"].get("or_equally") or []) | set(d["ev"].get("or_in_its_rings") or [])
        for i, o in enumerate(causes):
            if i in absorbed or o["family"] != "nic" or o["lead"].get("ip") not in places or not o["jobs"] & c["jobs"] \
                    or not all(d["detector"] == "flows.nic_bandwidth" for d in o["members"]):
                continue
            ow = _windows(o)
            if ow and all(e == first[0] for _, e in ow):
                for d in o["members"]:
                    d["evidence_only"] = True
                _join(c, o)
                absorbed.add(i)
    return [c for i, c in enumerate(causes) if i not in absorbed]


def _slow_alone(switch: dict, slow_spans: dict[str, list[tuple[int, int]]]) -> bool:
    """Whether the switch's flows were slow while its jobs' steps were not, in a fleet whose flows do
    show those jobs slowing at another time: a cause elsewhere (a slow GPU) can pace a switch's flows
    only by holding back the job's steps, so slow flows over a stretch of normal steps are the
    switch's own. A job slow all along (no onset seen) says nothing here."""
    spans = [ab for j in switch["jobs"] for ab in slow_spans.get(j, [])]
    if not spans:
        return False
    return any(d.get("start_ns") is not None and d["severity"] in ("warning", "critical")
               and not any(a <= (d.get("end_ns") or d["start_ns"]) and d["start_ns"] <= b for a, b in spans)
               for d in switch["members"] if d["detector"] == "flows.switch_bandwidth")


def _may_pace(cause: dict, switch: dict, rails: dict[str, set]) -> bool:
    """Whether a cause's rings can cross the switch: their rails meet (unknown rails: they may), and the
    switch's slow flows are mostly the cause's own ring's (a slow GPU paces its own rings: a spine whose
    slow flows were mostly another rail's ring is slow itself, demo seed 803). The flows' localization
    gives the collective holding most of a finding's slow flows, its share and its addresses (evidence
    top_ring_share, top_ring_ips); a finding without them, or a cause without an address: it may."""
    lead = cause["lead"]
    ip = lead.get("ip") if cause["family"] in ("gpu", "nic") else None
    tops = [json.loads(d.get("evidence") or "{}") for d in switch["members"] if d["detector"] == "flows.switch_bandwidth"]
    if ip and tops and all(t.get("top_ring_share") is not None for t in tops) and \
            not any(t["top_ring_share"] >= 0.5 and ip in (t.get("top_ring_ips") or []) for t in tops):
        return False
    sw = rails.get(switch["lead"].get("switch") or switch["lead"]["subject"])
    own = rails.get(lead.get("ip") or "") if cause["family"] in ("gpu", "nic") and lead.get("ip") else rails.get(lead.get("host") or "")
    return not sw or not own or bool(sw & own)


def _overlaps(a: dict, b: dict) -> bool:
    """Time spans (start_ns, end_ns) within the slack of each other; an unknown span overlaps all."""
    s, e, cs, ce = a.get("start_ns"), a.get("end_ns"), b.get("start_ns"), b.get("end_ns")
    if s is None or cs is None:
        return True
    return s <= (ce or cs) + _SLACK_NS and cs <= (e or s) + _SLACK_NS


def _group_orphans(orphans: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for d in orphans:
        out.setdefault(d["flow_job"] or d["subject"], []).append(d)
    return out


def problem_id(cause_key: str, first_seen_ns: int | None) -> str:
    """The id of the problem with this cause (a subject key such as `gpu:10.0.0.5`) first seen then."""
    return "prb-" + hashlib.sha1(f"{cause_key}|{first_seen_ns}".encode()).hexdigest()[:12]


def _problem(c: dict, members: list[dict], extra: list[dict], symptoms: list[dict], demoted_switches: list[dict]) -> dict:
    lead = c["lead"]
    fam = c["family"]
    all_members = members + extra + symptoms
    ids = sorted({d["verdict_id"] for d in all_members})
    label = _label({**lead, "family": fam})
    headline = _headline(lead["explanation"])
    if lead["scope"] in ("function", "kernel"):  # the full kernel name is evidence, not a title
        headline = headline.replace(lead["subject"], short_name(lead["subject"]))
    own = JOB_CAUSES.get(lead["detector"]) if fam == "job" else None
    if own:
        title = f"job {lead['flow_job'] or lead['subject']} {own[0]}: {headline}"
    elif fam == "job":
        title = f"job {lead['flow_job'] or lead['subject']} is slow and no machine, link or stage explains it: {headline}"
    else:
        title = f"{label}: {headline}"
    first = min((d["start_ns"] for d in all_members if d.get("start_ns") is not None), default=None)
    if first is not None:
        title += f" (since {_utc(first)} UTC)"
    severity = max((d["severity"] for d in members + extra + symptoms), key=lambda s: _SEV[s])
    team = lead["team"]
    reason = ROUTING[team]
    if demoted_switches:
        names = sorted({s["lead"]["subject"] for s in demoted_switches})
        reason += (f"; switch {names[0]} was" if len(names) == 1 else f"; switches {', '.join(names)} were") + \
            " flagged too, but the other jobs crossing " + ("it" if len(names) == 1 else "them") + " are not slower"
    ev = [_evidence_line(lead)] + [_evidence_line(d) for d in members + extra if d is not lead] + \
         [f"symptom: {_evidence_line(d)}" for d in symptoms]
    jobs = sorted({j for j in c.get("jobs", set()) | {d.get("flow_job") for d in all_members} if j})
    return dict(
        problem_id=problem_id(c["key"], c.get("start_ns")), title=title, severity=severity, team=team,
        team_reason=reason, cause=fam, subject=label, host=lead.get("host"), gpu=lead.get("gpu"), ip=lead.get("ip"),
        switch=lead.get("switch"), action=own[1] if own else ACTIONS[fam], job_ids=",".join(jobs) or None,
        detectors=",".join(sorted({d["detector"] for d in all_members})),
        metrics=",".join(sorted({d["metric"] for d in all_members})), n_verdicts=len(ids),
        start_ns=min((d["start_ns"] for d in all_members if d.get("start_ns") is not None), default=None),
        end_ns=max((d["end_ns"] for d in all_members if d.get("end_ns") is not None), default=None),
        evidence=json.dumps(ev), verdict_ids=",".join(ids), teams=",".join(sorted({d["team"] for d in all_members})),
        subjects=",".join(sorted({f"{d['scope']}:{d['subject']}" for d in all_members})))


DECLARED = (
    Table("problems", PROBLEMS, "One problem per cause: the findings of every detector about the same GPU, NIC, host, switch, stage "
          "or code, with the job slowdowns they explain, named as people name them (host and GPU), routed to the team that can "
          "fix the cause, with what to do.", "all", ("anomaly_verdicts", "job_clusters", "capture_ranks", "topology")),
    Table("problem_members", PROBLEM_MEMBERS, "Which verdicts make up which problem, and their role (cause, evidence, symptom).",
          "all", ("problems",)),
)
