"""Collective progress of a hung job, from PyTorch Flight Recorder dumps or the fleetscope tracer's
progress (the same JSON layout), in landing/stacks/<incident>/ (docs/CONTRACT.md 1.6):

fr_rank<R>.json or torch's own dump files, read by fleetscope.ingest.flight_recorder.

The analysis follows torch's fr_trace analyzer (torch/distributed/flight_recorder): collectives of
one process group run in the same order on every member, so entries match by (group, sequence id)
across ranks; walking the sequence ids in order, the first one that is not the same on every
member is where the job went wrong: ranks that never issued it (missing ranks: they are stuck
elsewhere, the culprits), ranks that issued a different collective or different sizes (a program
that diverged), or, everything matching, a collective issued everywhere that never completed (a
communication hang). Point-to-point calls match by (group, sender, receiver, their order). Only the
part of the sequence every member's ring buffer still holds is compared.
"""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from fleetscope.ingest.flight_recorder import FlightRecorderError, dump_files, entries_frame, read_dump
from fleetscope.schemas.base import conform
from fleetscope.xputimer import schemas as S

def _world(pg: str, desc: str) -> bool:
    return desc == "default_pg" or pg in ("world", "0")


def first_mismatches(ev: pl.DataFrame, members: dict[str, list[int]], dumped: list[int], incident: str = "") -> pl.DataFrame:
    """xputimer_hang_collectives: per process group (and p2p pair), the first collective not the
    same on every member, with its problem and the ranks concerned; or the last one, problem 'none'."""
    out = []
    dumped_set = set(dumped)
    coll = ev.filter(~pl.col("is_p2p"))
    # completion is known only where the recorder marks it (the tracer always; torch's NCCL recorder
    # with timing; gloo's recorder leaves every entry 'scheduled')
    states_known = bool((coll["state"] == "completed").any()) if coll.height else False
    for (pg, desc), g in coll.group_by("pg", "pg_desc", maintain_order=True):
        have = sorted(set(g["rank"].to_list()))
        mem = members.get(pg) or (sorted(dumped_set) if _world(pg, desc) else have)
        expected = [r for r in mem if r in dumped_set]
        span = g.group_by("rank").agg(pl.col("seq").min().alias("lo"), pl.col("seq").max().alias("hi"))
        last = dict(zip(span["rank"].to_list(), span["hi"].to_list()))
        lo = max([int(x) for x in span["lo"].to_list()] + [1])
        # a collective's time: when the last of the ranks that issued it did (groups' first mismatches are
        # ordered by it: a rank's program order then decides, not which rank raced ahead into the next call)
        per = (g.filter(pl.col("seq") >= lo).group_by("seq").agg(
            pl.col("rank"), pl.col("collective"), pl.col("sizes"), pl.col("state"), pl.col("created_ns").max())
            .sort("seq"))
        found = None
        for r in per.iter_rows(named=True):
            present = dict(zip(r["rank"], zip(r["collective"], r["sizes"], r["state"])))
            missing = [x for x in expected if x not in present and last.get(x, 0) < r["seq"]]
            kinds = {c for c, _, _ in present.values()}
            sizes = {s for c, s, _ in present.values() if c not in ("all_to_all", "scatter", "gather")}
            open_ = [x for x, (_, _, st) in present.items() if states_known and st != "completed"]
            if missing:
                problem, who = "missing_ranks", missing
            elif len(kinds) > 1:
                major = max(kinds, key=lambda k: sum(1 for c, _, _ in present.values() if c == k))
                problem, who = "collective_type_mismatch", sorted(x for x, (c, _, _) in present.items() if c != major)
            elif len(sizes) > 1:
                major = max(sizes, key=lambda k: sum(1 for _, s, _ in present.values() if s == k))
                problem, who = "size_mismatch", sorted(x for x, (c, s, _) in present.items() if s != major and c not in ("all_to_all",))
            elif open_:
                problem, who = "not_completed", sorted(open_)
            else:
                continue
            found = (r, problem, who, sorted(present))
            break
        if found is None and per.height:
            r = per.row(per.height - 1, named=True)
            found = (r, "none", [], sorted(r["rank"]))
        if found is None:
            continue
        r, problem, who, present = found
        out.append({"incident": incident, "process_group": pg, "group_desc": desc, "group_size": len(mem), "is_p2p": False,
                    "seq": int(r["seq"]), "collective": sorted(set(r["collective"]), key=r["collective"].index)[0],
                    "problem": problem, "ranks": json.dumps(who), "ranks_present": json.dumps(present),
                    "issued_ns": int(r["created_ns"]) if r["created_ns"] else None,
                    "source": ",".join(sorted(set(g["source"].to_list())))})
    out += _p2p_mismatches(ev.filter(pl.col("is_p2p") & pl.col("peer").is_not_null()), dumped_set, incident)
    df = pl.DataFrame(out, infer_schema_length=None) if out else pl.DataFrame()
    return S.HANG_COLLECTIVES.validate(conform(df, S.HANG_COLLECTIVES).sort("process_group", "seq"))


def _p2p_mismatches(p: pl.DataFrame, dumped: set[int], incident: str) -> list[dict]:
    """An outstanding send/recv whose matching call (same group, pair and order) the peer never
    issued: the peer is missing. Needs completion states (the tracer's progress has them)."""
    if p.height == 0:
        return []
    p = p.with_columns(
        src=pl.when(pl.col("collective") == "send").then(pl.col("rank")).otherwise(pl.col("peer")),
        dst=pl.when(pl.col("collective") == "send").then(pl.col("peer")).otherwise(pl.col("rank")))
    sends = p.filter(pl.col("collective") == "send").select("pg", "src", "dst", "seq", pl.lit(True).alias("_s"))
    recvs = p.filter(pl.col("collective") == "recv").select("pg", "src", "dst", "seq", pl.lit(True).alias("_r"))
    j = p.filter(pl.col("state") != "completed").join(sends, on=["pg", "src", "dst", "seq"], how="left").join(
        recvs, on=["pg", "src", "dst", "seq"], how="left")
    rows = []
    for r in j.sort("created_ns").iter_rows(named=True):
        other = r["dst"] if r["collective"] == "send" else r["src"]
        matched = r["_r"] if r["collective"] == "send" else r["_s"]
        if matched or other not in dumped:
            continue
        rows.append({"incident": incident, "process_group": f"{r['pg']}:{r['src']}->{r['dst']}", "group_desc": r["pg_desc"],
                     "group_size": 2, "is_p2p": True, "seq": int(r["seq"]), "collective": r["collective"],
                     "problem": "missing_ranks", "ranks": json.dumps([int(other)]), "ranks_present": json.dumps([int(r["rank"])]),
                     "issued_ns": int(r["created_ns"]) or None, "source": r["source"]})
        break  # the earliest outstanding unmatched call names the stuck peer
    return rows


def analyze_dumps(folder: str | Path) -> tuple[pl.DataFrame, list[str]]:
    """-> (xputimer_hang_collectives, notes about unreadable dumps)."""
    folder = Path(folder)
    dumps, notes = [], []
    for f in dump_files(folder):
        try:
            dumps.append(read_dump(f))
        except (FlightRecorderError, OSError) as exc:
            notes.append(str(exc))
    if not dumps:
        return S.HANG_COLLECTIVES.validate(conform(pl.DataFrame(), S.HANG_COLLECTIVES)), notes
    ev, members = entries_frame(dumps)
    return first_mismatches(ev, members, sorted({int(d["rank"]) for d in dumps}), folder.name), notes
