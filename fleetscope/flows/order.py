"""Row orders of large flow frames, computed on packed integer keys.

Sorting millions of flow records by several columns (a stream's addresses, ports and queue pairs, then
time) is where the flow analytics spent much of their time: a multi-column sort row-encodes every key
and moves every column of the frame. Here each key becomes a non-negative integer that keeps its
order (integers and times as offsets from their minimum, strings as their rank among the column's
distinct values, nulls first as polars sorts them), the keys are packed into as few 64-bit words as
their ranges allow, and the order is found by stable sorts of the words (least significant word first),
on arrays alone. The caller gathers only the columns it needs, once."""
from __future__ import annotations

import numpy as np
import polars as pl


def _codes(s: pl.Series) -> tuple[np.ndarray, int]:
    """Order-preserving non-negative codes of one key column and how many values they take (nulls as 0)."""
    has_null = s.null_count() > 0
    wide = s.dtype == pl.UInt64 or (s.dtype.is_integer() and s.len() > s.null_count()
                                    and int(s.max()) - int(s.min()) >= 1 << 62)
    if (s.dtype.is_integer() or s.dtype.is_temporal() or s.dtype == pl.Boolean) and not wide:
        v = s.cast(pl.Int64) if s.dtype != pl.Boolean else s.cast(pl.Int8).cast(pl.Int64)
        lo = v.min()
        if lo is None:
            return np.zeros(len(s), dtype=np.uint64), 1
        c = (v - lo + (1 if has_null else 0)).fill_null(0).to_numpy().astype(np.uint64)
        return c, int(v.max() - lo) + 1 + (1 if has_null else 0)
    if s.dtype.is_float() or wide:   # (hashes, and integers too far apart for an offset: their ranks)
        r = s.rank("dense")     # NaN sorts last in polars, and ranks last here
        c = r.fill_null(0).to_numpy().astype(np.uint64)
        return c, int(r.max() or 0) + 1
    u = s.drop_nulls().unique().sort()
    c = s.cast(pl.Enum(u.cast(pl.Utf8))).to_physical().cast(pl.Int64)
    c = (c + (1 if has_null else 0)).fill_null(0).to_numpy().astype(np.uint64)
    return c, u.len() + (1 if has_null else 0)


def lex_order(df: pl.DataFrame, keys: list[str]) -> np.ndarray:
    """The permutation that sorts df by keys (ascending, nulls first; ties keep their row order)."""
    n = df.height
    words: list[np.ndarray] = []
    cur, used = None, 0
    for k in keys:
        c, card = _codes(df[k])
        bits = max(int(card - 1).bit_length(), 1)
        if cur is None or used + bits > 63:
            if cur is not None:
                words.append(cur)
            cur, used = c.copy(), bits
        else:
            cur = (cur << np.uint64(bits)) | c
            used += bits
    if cur is not None:
        words.append(cur)
    perm = np.arange(n, dtype=np.int64)
    for w in reversed(words):
        perm = perm[np.argsort(w[perm], kind="stable")]
    return perm


def sort_by(df: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """df sorted by keys (as DataFrame.sort(keys, maintain_order=True) would)."""
    if df.height < 2:
        return df
    return df[lex_order(df, keys)]


def over_runs(df: pl.DataFrame, key: str, **aggs: pl.Expr) -> pl.DataFrame:
    """df with one column per aggregation, each row getting its run's value, where `key` numbers
    contiguous runs of rows 1, 2, 3, ... in row order (a cumulative count of run starts): what
    `expr.over(key)` gives, without hashing every row (one aggregation per run, then a gather)."""
    if df.height == 0 or not aggs:
        return df.with_columns(**{k: v for k, v in aggs.items()}) if aggs else df
    runs = df.group_by(key, maintain_order=True).agg(**aggs)
    k = df[key].to_numpy().astype(np.int64)
    first = int(runs[key][0])
    if runs.height != int(k[-1]) - first + 1:
        raise ValueError(f"over_runs: {key} does not number contiguous runs")
    idx = pl.Series(k - first)
    return df.with_columns(runs[c].gather(idx) for c in aggs)
