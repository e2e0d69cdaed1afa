"""Render the modelled traffic as the records real switch-mirroring collectors export (CONTRACT 1.2),
with each collector's own conventions (fleetscope.sim.conventions):

- which collector mirrors a flow: the one serving the sender's leaf (and with mirror=both also the
  receiver's: the flow is exported twice, with two clocks);
- record cutting: one record per transfer (`bucket`), per message of `message_bytes` (`message`,
  at most `message_cap` per transfer), idle-timeout flowlets merging consecutive transfers of one
  5-tuple (`flowlet`), or records cut every `active_timeout_ns` (`active_timeout`);
- retransmission splits (more of them on a NIC with bit errors), lost records, a clock offset and
  drift per collector;
- files: each collector rolls files every `file_span_s` seconds in its own format (parquet of any
  codec, csv or csv.gz in an RFC 4180 dialect: quoted header and fields, CRLF, a BOM), its own
  columns (duration_ns, end_ns or both; path as a list or an `a>b>c` string; optional and extra
  columns; any order); one file arrives late (part of a period's records in a second file written
  last), one is sent twice (a byte-identical copy under another name).
"""
from __future__ import annotations

import gzip
import os
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import polars as pl

from fleetscope.sim.background import KIND_CONTROL, KIND_MONITOR, KIND_PROBE
from fleetscope.sim.fabric import Fabric, mix

MTU = 4096
CONTRACT_ORDER = ["start_ns", "duration_ns", "end_ns", "src_ip", "dst_ip", "bytes", "packets", "src_port", "dst_port",
                  "src_qp", "dst_qp", "path"]
BOM = b"\xef\xbb\xbf"


# ---- transport: ports and queue pairs ---------------------------------------------------------------------

def transport(kind: np.ndarray, probe_transport: str) -> np.ndarray:
    """0 = RoCEv2 (UDP 4791, queue pairs), 1 = TCP, 2 = UDP."""
    t = np.zeros(kind.shape, np.int8)
    t[(kind == KIND_CONTROL) | (kind == KIND_MONITOR)] = 1
    if probe_transport != "rdma_ud":
        t[kind == KIND_PROBE] = 1 if probe_transport == "tcp" else 2
    return t


def identity(fh: np.ndarray, kind: np.ndarray, tr: np.ndarray, dst: np.ndarray) -> dict[str, np.ndarray]:
    """Ports and queue pair numbers of records, from their 5-tuple hash and transport: RoCEv2 hashes
    a source port per queue pair (destination 4791); TCP and UDP records have no queue pair (-1);
    a training job's TCP connections go to its peer's listening port."""
    h = fh.view(np.uint64)
    rdma = tr == 0
    job_tcp = (tr == 1) & (kind <= 1)
    listen = 32768 + (mix(dst, 7) % np.uint64(28000)).astype(np.int64)
    dport = np.select([rdma, job_tcp, kind == KIND_CONTROL, kind == KIND_MONITOR, tr == 1],
                      [4791, listen, 29500, 9100, 8080], 33434)
    sport = np.where(kind == KIND_MONITOR, 40000 + (h >> np.uint64(40)) % np.uint64(20000),
                     49152 + (h >> np.uint64(24)) % np.uint64(16384)).astype(np.int64)
    return {"src_port": sport, "dst_port": dport.astype(np.int64),
            "src_qp": np.where(rdma, (h & np.uint64(0xFFFFFF)).astype(np.int64) | 1, -1),
            "dst_qp": np.where(rdma, ((h >> np.uint64(32)) & np.uint64(0xFFFFFF)).astype(np.int64) | 1, -1)}


# ---- collector noise and cutting ----------------------------------------------------------------------------

def collector_records(df: pl.DataFrame, coll: dict, cc: dict, rng: np.random.Generator,
                      retrans_mult: dict[int, float] | None = None) -> pl.DataFrame:
    """The transfers one collector mirrors (columns kind, tr, src, dst, fh, start, dur, busy, bytes)
    -> the records it exports: retransmission splits, its record cutting, lost records, its clock
    (start_ns, duration_ns) and packet counts."""
    n = df.height
    p = np.full(n, cc["retrans_rate"])
    if retrans_mult:
        s, d = df["src"].to_numpy(), df["dst"].to_numpy()
        for e, mlt in retrans_mult.items():
            p = np.where((s == e) | (d == e), np.minimum(0.5, p * mlt), p)
    split = rng.random(n) < p
    if split.any():        # the same 5-tuple twice, a gap between the parts
        frac = rng.uniform(0.2, 0.8, n)
        gap = rng.uniform(20e3, 200e3, n)
        dur, byt, busy = df["dur"].to_numpy(), df["bytes"].to_numpy(), df["busy"].to_numpy()
        d1 = np.maximum(1, frac * dur - gap).astype(np.int64)
        b1 = np.maximum(1, frac * byt).astype(np.int64)
        first = df.with_columns(dur=pl.Series(np.where(split, d1, dur)), bytes=pl.Series(np.where(split, b1, byt)),
                                busy=pl.Series(np.where(split, np.minimum(busy, d1), busy)))
        idx = np.nonzero(split)[0]
        off = (frac[idx] * dur[idx]).astype(np.int64)
        second = df[idx].with_columns(
            start=pl.Series(df["start"].to_numpy()[idx] + off),
            dur=pl.Series(np.maximum(1, dur[idx] - off)),
            busy=pl.Series(np.maximum(1, np.minimum(busy[idx], dur[idx] - off))),
            bytes=pl.Series(np.maximum(1, byt[idx] - b1[idx])))
        df = pl.concat([first, second])
    m = coll["cutting"]
    if m == "message":
        df = _cut_messages(df, cc["message_bytes"], cc["message_cap"])
    elif m == "active_timeout":
        df = _cut_active(df, cc["active_timeout_ns"])
    elif m == "flowlet":
        df = _merge_flowlets(df, cc["flowlet_idle_ns"])
    df = df.filter(pl.Series(rng.random(df.height) >= cc["loss_rate"]))      # lost records
    st = df["start"].to_numpy()
    off = coll["skew_ns"] + ((st - cc.get("_t0", 0)) * coll["drift_ppm"] * 1e-6).astype(np.int64)
    s0 = st + off
    e0 = s0 + df["dur"].to_numpy()
    res = int(coll.get("time_resolution_ns", 1))
    if res > 1:           # timestamps truncated to the exporter's resolution (short records: duration 0)
        s0, e0 = s0 // res * res, e0 // res * res
    byt = df["bytes"].to_numpy()
    extra = (byt // (MTU * 2000)).astype(np.int64)           # a few retransmitted packets on big transfers
    return df.with_columns(start_ns=pl.Series(s0), duration_ns=pl.Series(e0 - s0),
                           packets=pl.Series((byt + MTU - 1) // MTU + extra))


def _repeat_frame(df: pl.DataFrame, n: np.ndarray) -> tuple[pl.DataFrame, np.ndarray]:
    idx = np.repeat(np.arange(df.height), n)
    pos = np.arange(idx.size) - np.repeat(np.cumsum(n) - n, n)
    return df[idx], pos


def _cut_messages(df: pl.DataFrame, msg: int, cap: int) -> pl.DataFrame:
    """RDMA transfers as messages: n = min(cap, ceil(bytes / msg)) records spread over the transfer,
    each lasting its share of the time the link was busy (on a paced ring hop: short, with gaps),
    the last ending where the transfer ends."""
    byt = df["bytes"].to_numpy()
    rdma = df["tr"].to_numpy() == 0
    n = np.where(rdma, np.clip((byt + msg - 1) // msg, 1, max(1, int(cap))), 1).astype(np.int64)
    dur, busy, st = df["dur"].to_numpy(), df["busy"].to_numpy(), df["start"].to_numpy()
    rep, pos = _repeat_frame(df, n)
    nn = np.repeat(n, n)
    d = np.repeat(dur, n)
    b = np.repeat(busy, n)
    B = np.repeat(byt, n)
    piece = np.minimum(np.maximum(1, b // nn), np.maximum(1, d // nn))
    # message i ends when its ring step completes (i+1)/n of the way through the transfer
    start = np.repeat(st, n) + ((pos + 1) * d // nn - piece).astype(np.int64)
    nb = B // nn + np.where(pos == nn - 1, B % nn, 0)
    return rep.with_columns(start=pl.Series(start), dur=pl.Series(piece), busy=pl.Series(piece),
                            bytes=pl.Series(np.maximum(1, nb)))


def _cut_active(df: pl.DataFrame, timeout: int) -> pl.DataFrame:
    """Records cut every `timeout` ns of a long transfer (an exporter's active timeout)."""
    dur = df["dur"].to_numpy()
    n = np.clip((dur + timeout - 1) // timeout, 1, 10_000).astype(np.int64)
    if (n == 1).all():
        return df
    byt, busy, st = df["bytes"].to_numpy(), df["busy"].to_numpy(), df["start"].to_numpy()
    rep, pos = _repeat_frame(df, n)
    nn = np.repeat(n, n)
    d = np.repeat(dur, n)
    B = np.repeat(byt, n)
    s0 = np.repeat(st, n) + pos * timeout
    d_i = np.where(pos == nn - 1, d - pos * timeout, timeout)
    nb = B // nn + np.where(pos == nn - 1, B % nn, 0)
    return rep.with_columns(start=pl.Series(s0), dur=pl.Series(np.maximum(1, d_i)),
                            busy=pl.Series(np.maximum(1, np.minimum(np.repeat(busy, n) // nn, d_i))),
                            bytes=pl.Series(np.maximum(1, nb)))


def _merge_flowlets(df: pl.DataFrame, idle: int) -> pl.DataFrame:
    """Consecutive transfers of one 5-tuple whose gap is below the idle timeout become one record:
    its bytes are the sum, it spans first start to last end."""
    if df.height == 0:
        return df
    d = df.sort("fh", "start")
    fh, st = d["fh"].to_numpy(), d["start"].to_numpy()
    end = st + d["dur"].to_numpy()
    new = np.ones(d.height, bool)
    new[1:] = (fh[1:] != fh[:-1]) | (st[1:] - end[:-1] > idle)
    first = np.flatnonzero(new)
    g_end = np.maximum.reduceat(end, first)
    dur = np.maximum(g_end - st[first], 1)
    return d[first].with_columns(dur=pl.Series(dur),
                                 bytes=pl.Series(np.add.reduceat(d["bytes"].to_numpy(), first)),
                                 busy=pl.Series(np.minimum(np.add.reduceat(d["busy"].to_numpy(), first), dur)))


# ---- paths -------------------------------------------------------------------------------------------------

def path_strings(fab: Fabric, src: np.ndarray, dst: np.ndarray, fh: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Per record an index into a list of distinct `leaf>spine>leaf` strings."""
    ls, sp, ld = fab.path_switches(src, dst, fh.view(np.uint64))
    nsw = len(fab.switch_name)
    code = (ls.astype(np.int64) * (nsw + 1) + (sp + 1)) * (nsw + 1) + (ld + 1)
    uniq, inv = np.unique(code, return_inverse=True)
    names = fab.switch_name
    out = []
    for c in uniq:
        rest, d1 = divmod(int(c), nsw + 1)
        a, s1 = divmod(rest, nsw + 1)
        out.append(names[a] if s1 == 0 else f"{names[a]}>{names[s1 - 1]}>{names[d1 - 1]}")
    return inv, out


# ---- files --------------------------------------------------------------------------------------------------

def _extra(name: str, part: pl.DataFrame, coll: dict, fab: Fabric, tr: np.ndarray) -> pl.Series:
    src = part["src"].to_numpy()
    if name == "exporter":
        return pl.Series(name, np.full(part.height, coll["name"]))
    if name == "vlan":
        return pl.Series(name, (100 + src % 8).astype(np.int64))
    if name == "dscp":
        return pl.Series(name, np.where(tr == 0, 26, 0).astype(np.int64))
    if name == "ip_proto":
        return pl.Series(name, np.where(tr == 1, 6, 17).astype(np.int64))
    if name == "tcp_flags":
        return pl.select(pl.when(pl.Series(tr) == 1).then(pl.lit(24, pl.Int64)).otherwise(None).alias(name))[name]
    if name == "ingress_if":
        return pl.Series(name, np.char.add("Ethernet1/", (fab.host_idx[src] % 32 + 1).astype(str)))
    if name == "sampling_rate":
        return pl.Series(name, np.ones(part.height, np.int64))
    if name == "ttl":
        return pl.Series(name, np.full(part.height, 64, np.int64))
    raise ValueError(name)


def _frame_for(part: pl.DataFrame, coll: dict, fab: Fabric, ip: pl.Series, paths: pl.Series, plist: pl.Series) -> pl.DataFrame:
    ident = identity(part["fh"].to_numpy(), part["kind"].to_numpy(), part["tr"].to_numpy(), part["dst"].to_numpy())
    cols: dict[str, pl.Series] = {"start_ns": part["start_ns"]}
    if coll["time_columns"] in ("duration", "both"):
        cols["duration_ns"] = part["duration_ns"]
    if coll["time_columns"] in ("end", "both"):
        cols["end_ns"] = (part["start_ns"] + part["duration_ns"]).alias("end_ns")
    cols["src_ip"] = ip.gather(part["src"].cast(pl.Int64)).alias("src_ip")
    cols["dst_ip"] = ip.gather(part["dst"].cast(pl.Int64)).alias("dst_ip")
    cols["bytes"] = part["bytes"]
    for c in ("packets", "src_port", "dst_port", "src_qp", "dst_qp"):
        if c not in coll["optional_columns"]:
            continue
        if c == "packets":
            cols[c] = part["packets"]
        elif c in ("src_qp", "dst_qp"):            # TCP / UDP records have no queue pair
            v = ident[c]
            cols[c] = pl.Series(c, v).set(pl.Series(v < 0), None) if (v < 0).any() else pl.Series(c, v)
        else:
            cols[c] = pl.Series(c, ident[c])
    pidx = part["pidx"].cast(pl.Int64)
    cols["path"] = (plist if coll["path_style"] == "list" else paths).gather(pidx).alias("path")
    for e in coll["extra_columns"]:
        cols[e] = _extra(e, part, coll, fab, part["tr"].to_numpy())
    out = pl.DataFrame(list(cols.values()))
    order = list(out.columns)
    if coll["shuffle_columns"]:
        r = np.random.default_rng([coll["collector"], 77, len(order)])
        order = [order[i] for i in r.permutation(len(order))]
    return out.select(order)


def csv_bytes(df: pl.DataFrame, dialect: dict) -> bytes:
    """RFC 4180 text as exporters write it: optional BOM, quoted header names, fields quoted
    minimally / always / when not numeric, LF or CRLF."""
    lt = dialect["line_terminator"]
    if df.schema.get("path") is not None and isinstance(df.schema["path"], pl.List):
        df = df.with_columns(pl.col("path").list.join(">"))
    hq = dialect["header_quoted"] or dialect["quote_style"] == "always"
    head = ",".join(f'"{c}"' if hq else c for c in df.columns) + lt
    body = df.write_csv(include_header=False, quote_style=dialect["quote_style"], line_terminator=lt)
    return (BOM if dialect["bom"] else b"") + head.encode() + body.encode()


def write_table(df: pl.DataFrame, path: Path, fmt: str, codec: str | None, dialect: dict | None) -> None:
    if fmt == "parquet":
        df.write_parquet(path, compression=codec or "zstd")
    elif fmt == "csv":
        path.write_bytes(csv_bytes(df, dialect))
    else:
        raw = csv_bytes(df, dialect)
        # mtime=0 and no name in the gzip header: same seed, same bytes
        with open(path, "wb") as fh, gzip.GzipFile(filename="", mode="wb", fileobj=fh, compresslevel=1, mtime=0) as gz:
            gz.write(raw)


def _ext(fmt: str) -> str:
    return {"parquet": ".parquet", "csv": ".csv", "csv.gz": ".csv.gz"}[fmt]


def _stem(coll: dict, t0_ns: int) -> str:
    t = datetime.fromtimestamp(t0_ns / 1e9, tz=timezone.utc)
    return coll["naming"].format(c=coll["name"], t=t, epoch=t0_ns // 1_000_000_000)


def render_flows(allf: pl.DataFrame, fab: Fabric, cc: dict, flows_dir: Path, seed: int,
                 retrans_mult: dict[int, float] | None = None, check=None) -> tuple[list[dict], int]:
    """Every collector's records and files, one collector at a time (memory stays per collector);
    returns (one row per written file, number of records). check(records) sees the first one."""
    flows_dir.mkdir(parents=True, exist_ok=True)
    src, dst = allf["src"].to_numpy(), allf["dst"].to_numpy()
    a, b = fab.collectors_of(src, dst)
    n_coll = len(cc["per_collector"])
    counts = np.bincount(a, minlength=n_coll) + np.bincount(b[b >= 0], minlength=n_coll)
    pick = np.random.default_rng([seed, 5])
    busy = np.flatnonzero(counts >= 40)
    late_c = int(pick.choice(busy)) if (cc["late_file"] and busy.size) else -1
    late = (float(pick.random()), float(pick.uniform(0.7, 0.95)), str(pick.choice(["-late", ".part2", "-1"])))
    cc = dict(cc, _t0=int(allf["start"].min()) if allf.height else 0)
    ip = pl.Series(fab.ip)
    rows, n_records = [], 0
    for c, coll in enumerate(cc["per_collector"]):
        mine = allf.filter(pl.Series(a == c))
        if (b == c).any():      # mirrored at both ends: a second copy (within one collector too)
            mine = pl.concat([mine, allf.filter(pl.Series(b == c))])
        if mine.height == 0:
            continue
        rec = collector_records(mine, coll, cc, np.random.default_rng([seed, 4, c]), retrans_mult)
        if check is not None:
            check(rec)
            check = None
        n_records += rec.height
        rows += _write_collector(rec, fab, coll, flows_dir, ip, late if c == late_c else None)
    # one file sent twice: a byte-identical copy under another name
    regular = [r for r in rows if r["role"] == "regular"]
    if cc["duplicate_file"] and regular:
        r = regular[int(pick.integers(0, len(regular)))]
        srcp = flows_dir / Path(r["file"]).name
        ext = _ext(r["format"])
        dup = flows_dir / cc["duplicate_naming"].format(stem=srcp.name[: -len(ext)], ext=ext)
        shutil.copyfile(srcp, dup)
        rows.append(r | {"file": f"flows/{dup.name}", "role": "duplicate", "duplicate_of": r["file"]})
    _set_mtimes(flows_dir.parent, rows)
    return rows, n_records


def _write_collector(rec: pl.DataFrame, fab: Fabric, c: dict, flows_dir: Path, ip: pl.Series, late) -> list[dict]:
    """One file per period of the collector's span, in its format; with `late` (where in its periods,
    which share of the records stays, the suffix) the tail of one period goes to a second file."""
    inv, paths = path_strings(fab, rec["src"].to_numpy(), rec["dst"].to_numpy(), rec["fh"].to_numpy())
    st = rec["start_ns"].to_numpy()
    if c.get("row_order", "start") == "end":           # exported when the flow expired
        st = st + rec["duration_ns"].to_numpy()
    span = c["file_span_s"] * 1_000_000_000
    period = st // span
    order = np.lexsort((st, period))                   # stable: same seed, same bytes
    d = rec.with_columns(pidx=pl.Series(inv.astype(np.int64)))[order]
    period = period[order]
    pstr = pl.Series("path", paths, dtype=pl.Utf8)
    plist = pstr.str.split(">")
    bounds = np.flatnonzero(np.diff(period)) + 1
    lo_hi = [(int(x), int(y)) for x, y in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [period.size]])) if y > x]
    late_at = -1
    if late is not None and lo_hi:
        big = [i for i, (x, y) in enumerate(lo_hi) if y - x >= 20] or [int(np.argmax([y - x for x, y in lo_hi]))]
        late_at = big[min(int(late[0] * len(big)), len(big) - 1)]
    rows = []
    for i, (lo, hi) in enumerate(lo_hi):
        part = d[lo:hi]
        stem = _stem(c, int(period[lo]) * span)
        chunks = [(part, stem, "regular")]
        if i == late_at and part.height >= 2:
            cut_at = max(1, min(part.height - 1, int(part.height * late[1])))
            chunks = [(part[:cut_at], stem, "regular"), (part[cut_at:], stem + late[2], "late")]
        for ch_df, name, role in chunks:
            p = flows_dir / (name + _ext(c["format"]))
            write_table(_frame_for(ch_df, c, fab, ip, pstr, plist), p, c["format"], c["codec"], c["dialect"])
            rows.append({"file": f"flows/{p.name}", "kind": "flows", "collector": c["collector"], "format": c["format"],
                         "codec": c["codec"], "dialect": None if c["dialect"] is None else repr(sorted(c["dialect"].items())),
                         "time_columns": c["time_columns"], "path_style": c["path_style"], "cutting": c["cutting"],
                         "n_records": ch_df.height, "first_start_ns": int(ch_df["start_ns"].min()),
                         "last_start_ns": int(ch_df["start_ns"].max()), "role": role, "duplicate_of": None})
    return rows


def _set_mtimes(landing: Path, rows: list[dict]) -> None:
    """Files land in time order over the last ten minutes; the late file lands last (a few seconds
    ago: settled, so a run right after the simulation sees it, as the newest file)."""
    now = time.time()
    order = sorted(range(len(rows)), key=lambda i: (rows[i]["role"] == "late", rows[i]["last_start_ns"], rows[i]["file"]))
    for rank, i in enumerate(order):
        t = now - 600 + 590 * rank / max(1, len(order))
        if rows[i]["role"] == "late":
            t = now - 5
        os.utime(landing / rows[i]["file"], (t, t))


def write_topology(fab: Fabric, topo_dir: Path, tc: dict) -> list[dict]:
    """The topology in its own dialect: optional columns dropped or kept, extra columns, any order,
    service hosts listed (in the same file or their own) or not."""
    topo_dir.mkdir(parents=True, exist_ok=True)
    full = fab.topology(service_hosts=tc["service_hosts"])
    cols = ["ip", "host"]
    if tc["has_gpu"]:
        cols.append("gpu")
    cols.append("leaf")
    if tc["has_spine"]:
        cols.append("spine")
    if tc["has_rail"]:
        cols.append("rail")
    if tc["has_rack_pod"]:
        cols += ["rack", "pod"]
    cols += list(tc["extra_columns"])
    if tc["shuffle_columns"]:
        r = np.random.default_rng([fab.seed, 62])
        cols = [cols[i] for i in r.permutation(len(cols))]
    df = full.select(cols)
    ext = ".parquet" if tc["format"] == "parquet" else ".csv"
    out = []
    frames = [("topology", df)]
    if tc["service_hosts"] and tc["service_file"] == "separate":
        frames = [("topology", df.head(fab.n_gpus)), ("service-hosts", df.slice(fab.n_gpus))]
    for name, fr in frames:
        p = topo_dir / (name + ext)
        write_table(fr, p, tc["format"], tc["codec"], tc["dialect"])
        out.append({"file": f"topology/{p.name}", "kind": "topology", "collector": None, "format": tc["format"],
                    "codec": tc["codec"], "dialect": None if tc["dialect"] is None else repr(sorted(tc["dialect"].items())),
                    "time_columns": None, "path_style": None, "cutting": None, "n_records": fr.height,
                    "first_start_ns": None, "last_start_ns": None, "role": "regular", "duplicate_of": None})
    return out
