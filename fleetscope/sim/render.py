"""Render the modelled execution as switch-mirrored flow records (docs/CONTRACT.md 1.2), with the noise
real collectors add (DESIGN.md "Realistic traffic"):

- one ERSPAN collector per 8 leaf groups x 2 rails; each writes one file per minute, in its own
  format: parquet with duration_ns and path as a list, parquet with end_ns and a `>` path string,
  or gzipped CSV with end_ns and a `>` path string;
- ~1% of records missing, ~0.5% split in two by a retransmission (same 5-tuple, bytes split,
  a gap between the parts), a constant clock skew per collector of tens of microseconds;
- background storage / checkpoint traffic and monitoring scrapes between GPU NICs and servers
  outside the topology, aperiodic (Poisson arrivals, heavy-tailed sizes): not a job.
"""
from __future__ import annotations

import gzip
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import polars as pl

from fleetscope.sim.fabric import Fabric

KIND_STORAGE, KIND_MONITOR = 2, 3
FLOW_COLUMNS = ["start_ns", "duration_ns", "end_ns", "src_ip", "dst_ip", "bytes", "packets", "src_port", "dst_port",
                "src_qp", "dst_qp", "path"]
MISSING_RATE = 0.01
SPLIT_RATE = 0.005
MAX_SKEW_NS = 50_000
MTU = 4096


def background_flows(fab: Fabric, window: tuple[int, int], rng: np.random.Generator) -> dict:
    """Storage reads / checkpoint writes over RDMA and monitoring scrapes (TCP)."""
    W0, W1 = window
    minutes = (W1 - W0) / 60e9
    n_storage = fab.n_bg - 2
    # storage: ~1.5 transfers per host per minute, Poisson in time, lognormal sizes
    n_s = int(rng.poisson(1.5 * fab.n_hosts * minutes + 10))
    gpu = rng.integers(0, fab.n_gpus, n_s)
    srv = fab.n_gpus + rng.integers(0, n_storage, n_s)
    write = rng.random(n_s) < 0.7                  # checkpoint writes GPU -> storage, else reads
    size = np.clip(rng.lognormal(np.log(2e8), 1.3, n_s), 64e3, 8e9).astype(np.int64)
    rate = rng.uniform(5e9, 20e9, n_s)
    # monitoring: ~4 scrapes per host per minute to the host's first NIC, small
    n_m = int(rng.poisson(4 * fab.n_hosts * minutes + 4))
    mhost = rng.integers(0, fab.n_hosts, n_m)
    mon = fab.n_gpus + n_storage + rng.integers(0, 2, n_m)
    msize = rng.integers(2_000, 40_000, n_m)
    src = np.concatenate([np.where(write, gpu, srv), mon])
    dst = np.concatenate([np.where(write, srv, gpu), mhost * 8])
    start = np.concatenate([rng.uniform(W0, W1, n_s), rng.uniform(W0, W1, n_m)]).astype(np.int64)
    dur = np.concatenate([size / rate * 1e9, rng.uniform(5e4, 5e5, n_m)]).astype(np.int64)
    return {"job": np.full(src.size, -1, np.int32), "kind": np.concatenate([np.full(n_s, KIND_STORAGE, np.int8), np.full(n_m, KIND_MONITOR, np.int8)]),
            "step": np.full(src.size, -1, np.int64), "src": src.astype(np.int32), "dst": dst.astype(np.int32),
            "start": start, "dur": np.maximum(dur, 1), "bytes": np.concatenate([size, msize]).astype(np.int64),
            "ch": np.zeros(src.size, np.int8)}


def _mix(*xs: np.ndarray) -> np.ndarray:
    h = np.zeros(len(xs[0]), np.uint64)
    for i, x in enumerate(xs):
        h = (h ^ (x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15 + i))) * np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(31)
    return h


def add_collector_noise(df: pl.DataFrame, fab: Fabric, rng: np.random.Generator) -> pl.DataFrame:
    """Columns job, kind, step, src, dst, start, dur, bytes, ch (true times) -> the records the
    collectors export: collector, start_ns, duration_ns, src, dst, bytes, packets, ports, qps."""
    n = df.height
    src, dst = df["src"].to_numpy(), df["dst"].to_numpy()
    ch, kind = df["ch"].to_numpy(), df["kind"].to_numpy()
    h1 = _mix(src, dst, ch, kind)
    h2 = _mix(dst, src, ch, kind + 11)
    rdma = kind != KIND_MONITOR
    skew = rng.integers(-MAX_SKEW_NS, MAX_SKEW_NS + 1, fab.n_collectors())
    coll = fab.collector_of(src, dst)
    df = df.with_columns(
        collector=pl.Series(coll.astype(np.int32)),
        src_qp=pl.Series(np.where(rdma, (h1 & np.uint64(0xFFFFFF)).astype(np.int64) | 1, -1)),
        dst_qp=pl.Series(np.where(rdma, (h2 & np.uint64(0xFFFFFF)).astype(np.int64) | 1, -1)),
        src_port=pl.Series((49152 + (h1 >> np.uint64(24)) % np.uint64(16384)).astype(np.int64)),
        dst_port=pl.Series(np.where(rdma, 4791, 9100).astype(np.int64)),
    ).with_columns(
        pl.when(pl.col("src_qp") < 0).then(None).otherwise(pl.col("src_qp")).alias("src_qp"),
        pl.when(pl.col("dst_qp") < 0).then(None).otherwise(pl.col("dst_qp")).alias("dst_qp"),
    )
    keep = rng.random(n) >= MISSING_RATE
    split = (rng.random(n) < SPLIT_RATE) & keep
    frac = rng.uniform(0.2, 0.8, n)
    gap = rng.uniform(20e3, 200e3, n)
    dur = df["dur"].to_numpy()
    byt = df["bytes"].to_numpy()
    first_dur = np.maximum(1, frac * dur - gap).astype(np.int64)
    first_bytes = np.maximum(1, (frac * byt)).astype(np.int64)
    base = df.with_columns(
        dur=pl.Series(np.where(split, first_dur, dur)),
        bytes=pl.Series(np.where(split, first_bytes, byt)),
    ).filter(pl.Series(keep))
    sidx = np.nonzero(split)[0]
    second = df[sidx].with_columns(
        start=pl.Series(df["start"].to_numpy()[sidx] + (frac[sidx] * dur[sidx]).astype(np.int64)),
        dur=pl.Series(np.maximum(1, dur[sidx] - (frac[sidx] * dur[sidx]).astype(np.int64))),
        bytes=pl.Series(np.maximum(1, byt[sidx] - first_bytes[sidx])),
    )
    out = pl.concat([base, second])
    extra_pk = (out["bytes"].to_numpy() // (MTU * 2000)).astype(np.int64)   # a few retransmitted packets
    out = out.with_columns(
        start_ns=pl.col("start") + pl.Series(skew[out["collector"].to_numpy()]),
        duration_ns=pl.col("dur"),
        packets=(pl.col("bytes") + MTU - 1) // MTU + pl.Series(extra_pk),
    )
    return out


def path_strings(fab: Fabric, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Per flow an index into a list of distinct `leaf>spine>leaf` strings. The spine follows from
    the source leaf, so (source leaf, destination leaf) names a path: a dense O(n) mapping."""
    ls, sp, ld = fab.path_switches(src, dst)
    nsw = len(fab.switch_name)
    code = fab.leaf[src].astype(np.int64) * nsw + fab.leaf[dst]
    present = np.zeros(nsw * nsw, bool)
    present[code] = True
    uniq = np.flatnonzero(present)
    index = np.cumsum(present) - 1
    names = fab.switch_name
    out = []
    for c in uniq:
        a, d = divmod(int(c), nsw)
        out.append(names[a] if a == d else f"{names[a]}>{names[fab.spine_of_leaf(a)]}>{names[d]}")
    return index[code], out


def write_flow_files(df: pl.DataFrame, fab: Fabric, flows_dir: Path, window_start: int) -> list[Path]:
    """One file per collector per minute, rows in time order; the collector's index picks its export
    format. Sorting and partitioning run on integer columns; strings are gathered per file."""
    flows_dir.mkdir(parents=True, exist_ok=True)
    src, dst = df["src"].to_numpy(), df["dst"].to_numpy()
    inv, paths = path_strings(fab, src, dst)
    minute = (df["start"].to_numpy() - window_start) // 60_000_000_000
    coll = df["collector"].to_numpy().astype(np.int64)
    key = coll * (int(minute.max()) + 1 if minute.size else 1) + minute
    order = np.lexsort((dst, src, df["start_ns"].to_numpy(), key))        # stable: same seed, same bytes
    key = key[order]
    cols = ["start_ns", "duration_ns", "bytes", "packets", "src_port", "dst_port", "src_qp", "dst_qp"]
    num = df.select(cols)[order]
    src, dst, inv, coll, minute = src[order], dst[order], inv[order], coll[order], minute[order]
    ip = pl.Series(fab.ip)
    pstr = pl.Series(paths, dtype=pl.Utf8)
    plist = pstr.str.split(">")
    bounds = np.flatnonzero(np.diff(key)) + 1
    written = []
    for lo, hi in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [key.size]])):
        if hi <= lo:
            continue
        c, mnt = int(coll[lo]), int(minute[lo])
        t = datetime.fromtimestamp((window_start + mnt * 60_000_000_000) / 1e9, tz=timezone.utc)
        stem = f"erspan-c{c:03d}-{t:%Y%m%dT%H%M}"
        fmt = c % 4
        part = num[int(lo):int(hi)]
        sip = ip.gather(pl.Series(src[lo:hi].astype(np.int64))).alias("src_ip")
        dip = ip.gather(pl.Series(dst[lo:hi].astype(np.int64))).alias("dst_ip")
        pidx = pl.Series(inv[lo:hi].astype(np.int64))
        if fmt in (0, 1):       # duration and a list path
            out = part.select("start_ns", "duration_ns").with_columns(sip, dip).hstack(
                part.select(cols[2:])).with_columns(plist.gather(pidx).alias("path"))
            p = flows_dir / f"{stem}.parquet"
            out.write_parquet(p, compression="zstd", compression_level=1)
        else:                   # end time and a `>` path string
            out = part.select("start_ns", end_ns=pl.col("start_ns") + pl.col("duration_ns")).with_columns(sip, dip).hstack(
                part.select(cols[2:] if fmt == 2 else ["bytes", "packets", "dst_port", "src_qp", "dst_qp"])
            ).with_columns(pstr.gather(pidx).alias("path"))
            if fmt == 2:
                p = flows_dir / f"{stem}.parquet"
                out.write_parquet(p, compression="zstd", compression_level=1)
            else:
                p = flows_dir / f"{stem}.csv.gz"
                # mtime=0 and no name in the gzip header: same seed, same bytes
                with open(p, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=1, mtime=0) as fh:
                    out.write_csv(fh)
        written.append(p)
    return sorted(written)
