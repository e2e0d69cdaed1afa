"""Hang diagnosis (XPUTimer 5.1) over landing/stacks/<incident>/ (docs/CONTRACT.md 1.6).

1. Call-stack analysis: each rank's main-thread stack (py-spy dump or faulthandler text) is inside
   a collective or not. Ranks not inside a collective while others wait in one are the culprits
   (a non-communication error: crash, dead loop, I/O, a GPU that stopped).
2. Collective progress (fleetscope.xputimer.flight: PyTorch Flight Recorder dumps or the fleetscope
   tracer's progress, fr_rank<R>.json): per process group, the first collective not the same on
   every member; ranks that never issued it are culprits too (with or without their stacks), ranks
   that issued another collective or other sizes are a program that diverged.
3. All ranks inside the same collective: a communication hang. ring.json
   ([{"rank", "peer", "channel", "step"}], the loop step each ring connection reached in the hung
   kernel) names the faulty link: the connection with the lowest step, and its two GPUs.
Hangs go to operations (isolate the machines, restart the job); a diverged program to algorithm
(the ranks' code issued different collectives: the script or its configuration).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl

from typing import NamedTuple

from fleetscope.schemas.base import conform
from fleetscope.findings.verdicts import make_verdicts
from fleetscope.xputimer import schemas as S
from fleetscope.xputimer.detectors import TEAM_FOR_CAUSE
from fleetscope.xputimer.flight import analyze_dumps

_COLLECTIVES = {"all_reduce", "allreduce", "all_gather", "all_gather_into_tensor", "allgather", "reduce_scatter",
                "reduce_scatter_tensor", "_reduce_scatter_base", "_all_gather_base", "reducescatter", "broadcast",
                "barrier", "monitored_barrier", "all_to_all", "all_to_all_single", "alltoall", "reduce", "gather",
                "scatter", "send", "recv", "isend", "irecv", "batch_isend_irecv", "wait", "synchronize"}
# names that are collectives only inside torch.distributed / NCCL code (too generic elsewhere)
_GENERIC = {"send", "recv", "wait", "reduce", "gather", "scatter", "broadcast", "synchronize"}
# (collectors/tracer.py: the tracer's proxy of an async collective's Work.wait)
_DIST_FILE = re.compile(r"distributed|c10d|nccl|gloo|megatron/core/parallel|deepspeed/comm|collectors[/\\\\]tracer", re.I)

_PYSPY_THREAD = re.compile(r'^Thread (\S+) \((\w+)\)(?:: "(.*)")?')
_PYSPY_FRAME = re.compile(r"^\s+(\S.*?) \((.*?)(?::(\d+))?\)\s*$")
_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)(?: \[(.*?)\])? \(most recent call first\):")
_FH_FRAME = re.compile(r'^\s+File "(.*?)", line (\d+) in (\S+)')


def parse_stack_dump(text: str) -> list[dict]:
    """py-spy or faulthandler text -> threads [{"id", "name", "frames": [(function, file)] innermost first}]."""
    threads: list[dict] = []
    for line in text.splitlines():
        m = _FH_THREAD.match(line)
        if m:
            threads.append({"id": m.group(2), "name": m.group(3) or ("current" if m.group(1).startswith("Current") else ""), "frames": []})
            continue
        m = _PYSPY_THREAD.match(line)
        if m:
            threads.append({"id": m.group(1), "name": m.group(3) or "", "frames": []})
            continue
        if not threads:
            continue
        m = _FH_FRAME.match(line)
        if m:
            threads[-1]["frames"].append((m.group(3), m.group(1)))
            continue
        m = _PYSPY_FRAME.match(line)
        if m:
            threads[-1]["frames"].append((m.group(1), m.group(2)))
    return threads


def main_thread(threads: list[dict]) -> dict | None:
    """The training thread: py-spy's MainThread, else the thread not started by threading (its
    outermost frame is not threading.py's _bootstrap), else the first."""
    for th in threads:
        if th["name"] == "MainThread":
            return th
    for th in threads:
        if th["frames"] and not th["frames"][-1][1].endswith("threading.py"):
            return th
    return threads[0] if threads else None


def collective_frame(frames: list[tuple[str, str]]) -> str | None:
    """The innermost frame that is a collective call (its function name, normalized)."""
    for func, file in frames:
        f = func.split(".")[-1].lower()
        if f in _COLLECTIVES and (f not in _GENERIC or _DIST_FILE.search(file or "")):
            return f.replace("_into_tensor", "").replace("_tensor", "")
        if f.startswith("nccl") and ("kernel" in f or f.startswith("ncclallreduce")):
            return f
    return None


def _stack_frame(d: Path, files: list[Path]) -> pl.DataFrame:
    if not files:
        return S.HANG_RANKS.validate(conform(pl.DataFrame(), S.HANG_RANKS))
    rows = []
    for f in files:
        m = re.match(r"rank(\d+)\.txt$", f.name)
        if not m:
            raise ValueError(f"{f}: stack dump names must be rank<R>.txt (docs/CONTRACT.md 1.6)")
        th = main_thread(parse_stack_dump(f.read_text(errors="replace")))
        frames = th["frames"] if th else []
        coll = collective_frame(frames)
        rows.append({"incident": d.name, "rank": int(m.group(1)), "in_collective": coll is not None, "collective": coll,
                     "top_function": frames[0][0] if frames else None, "frames": len(frames)})
    df = pl.DataFrame(rows, infer_schema_length=None).with_columns(pl.lit(False).alias("culprit"))
    any_in = df["in_collective"].any()
    df = df.with_columns((~pl.col("in_collective") & pl.lit(bool(any_in))).alias("culprit")).sort("rank")
    return S.HANG_RANKS.validate(conform(df, S.HANG_RANKS))


def ring_lowest(ring_path: str | Path) -> dict | None:
    p = Path(ring_path)
    if not p.exists():
        return None
    ring = json.loads(p.read_text())
    if not isinstance(ring, list) or not ring:
        raise ValueError(f"{p}: ring.json must be a non-empty list of {{rank, peer, channel, step}}")
    bad = [i for i, r in enumerate(ring) if not {"rank", "peer", "step"} <= set(r)]
    if bad:
        raise ValueError(f"{p}: entries {bad[:5]} lack rank/peer/step")
    steps = sorted(int(r["step"]) for r in ring)
    low = min(ring, key=lambda r: int(r["step"]))
    return {"rank": int(low["rank"]), "peer": int(low["peer"]), "channel": low.get("channel"), "step": int(low["step"]),
            "median_step": steps[len(steps) // 2], "n": len(ring)}


class HangDiagnosis(NamedTuple):
    ranks: pl.DataFrame          # xputimer_hang_ranks (from the stack dumps)
    verdicts: pl.DataFrame
    collectives: pl.DataFrame    # xputimer_hang_collectives (from the collective progress dumps)
    notes: list


def diagnose_hang(incident_dir: str | Path, job_id: str | None = None, rank_hosts: dict[int, str] | None = None,
                  rank_ips: dict[int, str] | None = None) -> HangDiagnosis:
    """Stack dumps (rank<R>.txt), collective progress (fr_rank<R>.json / Flight Recorder dumps) and
    ring progress (ring.json) of one incident -> the per-rank picture, the first mismatching
    collective per process group, and the verdicts. rank_hosts / rank_ips (when known from
    topology or capture metadata) name the machines and the link in the subjects."""
    d = Path(incident_dir)
    files = sorted(d.glob("rank*.txt"))
    colls, notes = analyze_dumps(d)
    if not files and colls.height == 0:
        raise FileNotFoundError(f"no rank<R>.txt stack dumps and no collective progress (fr_rank<R>.json) in {d}")
    ranks = _stack_frame(d, files)
    inc = d.name
    name = (lambda r: f"rank {r} ({rank_hosts[r]})" if rank_hosts and r in rank_hosts else f"rank {r}")
    top = dict(zip(ranks["rank"].to_list(), ranks["top_function"].to_list()))
    # the earliest problem in any process group is where the job went wrong
    first = colls.filter(pl.col("problem") != "none").sort("issued_ns", nulls_last=True)
    first = first.row(0, named=True) if first.height else None
    missing = json.loads(first["ranks"]) if first and first["problem"] == "missing_ranks" else []
    rows = []
    culprits = sorted(set(ranks.filter(pl.col("culprit"))["rank"].to_list()) | set(missing))
    if culprits:
        waiting = ranks.filter(pl.col("in_collective"))
        colls_s = sorted({"wait() of an async collective" if c == "wait" else c for c in waiting["collective"].drop_nulls().to_list()})
        for r in culprits:
            parts = []
            if first and r in missing:
                parts.append(f"never issued {first['collective']} #{first['seq']} of group {first['process_group']} that "
                             f"ranks {json.loads(first['ranks_present'])} issued")
            if r in top:
                parts.append(f"is stuck outside any collective (in {top[r]})" if r in ranks.filter(pl.col("culprit"))["rank"].to_list()
                             else f"is in {top[r]}")
            text = " and ".join(parts) + (f", while {waiting.height} rank(s) wait in {', '.join(colls_s)}" if waiting.height else "")
            rows.append(dict(detector="xputimer.hang", scope="rank", subject=str(r), job_id=job_id,
                             metric="hang_missing_from_collective" if r in missing else "hang_not_in_collective", value=1.0,
                             severity="critical", team=TEAM_FOR_CAUSE["hang"],
                             explanation=f"hang {inc}: {name(r)} {text}: its machine is the source; "
                                         "isolate it and restart the job.",
                             evidence=json.dumps({"incident": inc, "top_function": top.get(r),
                                                  "first_mismatch": {k: first[k] for k in ("process_group", "seq", "collective", "problem")} if first else None}),
                             window_id=inc))
    elif first and first["problem"] in ("collective_type_mismatch", "size_mismatch"):
        who = json.loads(first["ranks"])
        what = "a different collective" if first["problem"] == "collective_type_mismatch" else "different tensor sizes"
        rows.append(dict(detector="xputimer.hang", scope="job", subject=job_id or inc, job_id=job_id,
                         metric=f"hang_{first['problem']}", value=float(len(who)), severity="critical", team=TEAM_FOR_CAUSE["diverged_program"],
                         explanation=f"hang {inc}: at {first['collective']} #{first['seq']} of group {first['process_group']}, "
                                     f"ranks {who} issued {what} than the other ranks: the ranks' code diverged (a condition "
                                     f"on the rank, data-dependent control flow, mismatched shapes); fix the training script.",
                         evidence=json.dumps({"incident": inc, **{k: first[k] for k in ("process_group", "seq", "collective", "problem", "ranks")}}),
                         window_id=inc))
    elif (ranks.height and ranks["in_collective"].all()) or (first and first["problem"] == "not_completed"):
        colls_s = sorted(set(ranks["collective"].drop_nulls().to_list())) or ([first["collective"]] if first else [])
        where = f" ({first['collective']} #{first['seq']} of group {first['process_group']}, issued by every member)" if first else ""
        low = ring_lowest(d / "ring.json")
        n = ranks.height or len(json.loads(first["ranks_present"]))
        if low is None:
            rows.append(dict(detector="xputimer.hang", scope="job", subject=job_id or inc, job_id=job_id,
                             metric="hang_in_collective", value=float(n), severity="critical", team=TEAM_FOR_CAUSE["hang"],
                             explanation=f"hang {inc}: all {n} ranks wait in {', '.join(colls_s)}{where} (a communication "
                                         f"hang); no ring.json to name the link: collect intra-kernel ring progress.",
                             window_id=inc))
        else:
            a, b = low["rank"], low["peer"]
            subj = f"{rank_ips[a]}-{rank_ips[b]}" if rank_ips and a in rank_ips and b in rank_ips else f"rank{a}-rank{b}"
            rows.append(dict(detector="xputimer.hang", scope="link", subject=subj, job_id=job_id,
                             metric="ring_min_step", value=float(low["step"]), baseline=float(low["median_step"]),
                             severity="critical", team=TEAM_FOR_CAUSE["hang"],
                             explanation=f"hang {inc}: all ranks wait in {', '.join(colls_s)}{where}; the ring connection "
                                         f"{name(a)} -> {name(b)} (channel {low['channel']}) reached step {low['step']} while the "
                                         f"median connection reached {low['median_step']}: the link between these GPUs is faulty.",
                             evidence=json.dumps({"incident": inc, "gpus": [a, b], **low}), window_id=inc))
    return HangDiagnosis(ranks, make_verdicts(rows), colls, notes)


def diagnose_all(stacks_dir: str | Path, job_id: str | None = None, **kw) -> HangDiagnosis:
    """Every incident folder under landing/stacks/."""
    parts = [diagnose_hang(d, job_id, **kw) for d in sorted(Path(stacks_dir).iterdir())
             if d.is_dir() and (any(d.glob("rank*.txt")) or any(d.glob("fr_rank*.json")))]
    if not parts:
        return HangDiagnosis(conform(pl.DataFrame(), S.HANG_RANKS), make_verdicts([]),
                             conform(pl.DataFrame(), S.HANG_COLLECTIVES), [])
    return HangDiagnosis(*(pl.concat([getattr(p, f) for p in parts]) for f in ("ranks", "verdicts", "collectives")),
                         [n for p in parts for n in p.notes])
