"""Fast, bounded-memory reader of PyTorch profiler (Kineto) Chrome traces into the `trace_events` table.

Why not json.load: a Python dict per event is what makes HTA slow and memory hungry. Here the file is
decompressed in blocks, a vectorized (numpy) scanner finds the top-level boundaries of the events in
the `traceEvents` array (quotes, escapes, brace depth), rewrites each block as newline-delimited JSON
(one event per line) and polars' native NDJSON reader parses only the fields we need into columns.
Memory is one block of text plus the columnar result; the metadata around the array (distributedInfo,
deviceProperties, baseTimeNanoseconds, ...) is small and parsed with json.

Timestamps are microseconds in the file, read as text and converted exactly to integer nanoseconds
(newer Kineto writes them relative to `baseTimeNanoseconds`, which is added)."""
from __future__ import annotations

import gzip
import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from fleetscope.schemas.base import conform
from fleetscope.traces.schemas import TRACE_EVENTS

BLOCK_BYTES = 16 << 20  # decompressed text per parse block


class TraceError(ValueError):
    """The file is not a readable PyTorch profiler trace; the message says why and what to do."""


@dataclass
class TraceFile:
    events: pl.DataFrame  # trace_events schema
    meta: dict = field(default_factory=dict)
    path: str = ""


# ---------------------------------------------------------------- vectorized JSON structure scan
_QUOTE, _OPEN, _CLOSE, _COMMA, _BSLASH = 1, 2, 3, 4, 5
_LUT = np.zeros(256, np.uint8)
_LUT[ord('"')] = _QUOTE
_LUT[ord("{")] = _OPEN
_LUT[ord("[")] = _OPEN
_LUT[ord("}")] = _CLOSE
_LUT[ord("]")] = _CLOSE
_LUT[ord(",")] = _COMMA
_LUT[ord("\\")] = _BSLASH
_WS_TO_SPACE = bytes.maketrans(b"\n\r\t", b"   ")


def _structure(a: np.ndarray):
    """Structural characters of a JSON text that starts outside any string.
    Returns (positions, kinds, depth_after) of the braces/brackets/commas outside strings, where
    depth_after is the nesting depth after the character relative to the start."""
    cls = _LUT[a]
    pos = np.flatnonzero(cls)
    kind = cls[pos]
    is_q = kind == _QUOTE
    if (kind == _BSLASH).any():
        # a quote is escaped when an odd run of backslashes precedes it
        idx = np.arange(a.size)
        last_non_bs = np.maximum.accumulate(np.where(a != ord("\\"), idx, -1))
        qpos = pos[is_q]
        prev = qpos - 1
        run = np.where(prev >= 0, prev - last_non_bs[np.maximum(prev, 0)], 0)
        esc = (run % 2) == 1
        is_q = is_q.copy()
        is_q[np.flatnonzero(is_q)[esc]] = False
    outside = (np.cumsum(is_q) & 1) == 0
    keep = outside & ~is_q & (kind != _BSLASH)
    pos, kind = pos[keep], kind[keep]
    delta = np.zeros(pos.size, np.int64)
    delta[kind == _OPEN] = 1
    delta[kind == _CLOSE] = -1
    return pos, kind, np.cumsum(delta)


# ---------------------------------------------------------------- byte stream
def _open_stream(path: Path):
    """Binary stream of the decompressed file (gzip detected by magic, not by extension)."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(2)
    except OSError as exc:
        raise TraceError(f"{path}: cannot open ({exc})") from exc
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")
    return open(path, "rb")


def _read(stream, n: int, path: Path) -> bytes:
    try:
        return stream.read(n)
    except EOFError as exc:
        raise TraceError(f"{path}: truncated gzip file ({exc}); the copy is incomplete, re-copy or re-export the trace") from exc
    except (gzip.BadGzipFile, zlib.error, OSError) as exc:
        raise TraceError(f"{path}: corrupt gzip data ({exc}); re-copy or re-export the trace") from exc


_READ_SCHEMA = {
    "ph": pl.Utf8,
    "cat": pl.Utf8,
    "name": pl.Utf8,
    "pid": pl.Utf8,
    "tid": pl.Utf8,
    "ts": pl.Utf8,
    "dur": pl.Utf8,
    "args": pl.Struct({
        "External id": pl.Int64,
        "correlation": pl.Int64,
        "device": pl.Int64,
        "stream": pl.Utf8,  # an int on GPU events, "0x0" on hip runtime calls
        "Sequence number": pl.Int64,
        "Fwd thread id": pl.Int64,
        "cuda_sync_kind": pl.Utf8,
        "wait_on_stream": pl.Int64,
        "wait_on_cuda_event_record_corr_id": pl.Int64,
        "Collective name": pl.Utf8,
        "In msg nelems": pl.Int64,
        "Out msg nelems": pl.Int64,
        "Group size": pl.Int64,
        "dtype": pl.Utf8,
        "Process Group Name": pl.Utf8,
        "Process Group Ranks": pl.Utf8,
        "Input Dims": pl.Utf8,
        "Input type": pl.Utf8,
    }),
}


def _parse_block(text: bytes, seps: np.ndarray, path: Path, offset: int) -> pl.DataFrame:
    """One block holding whole events separated by top-level commas -> raw columns."""
    buf = np.frombuffer(text.translate(_WS_TO_SPACE), np.uint8).copy()
    buf[seps] = ord("\n")
    try:
        df = pl.read_ndjson(buf.tobytes(), schema=_READ_SCHEMA, ignore_errors=True)
    except Exception as exc:  # polars raises ComputeError with the parser's message
        raise TraceError(f"{path}: malformed JSON in traceEvents near byte {offset}: {exc}; the file is corrupt, re-export it") from exc
    return df


def _scan_events(path: Path) -> tuple[list[pl.DataFrame], dict, int]:
    """Stream the file: returns raw event frames, the metadata dict and the number of text bytes."""
    stream = _open_stream(path)
    try:
        head = b""
        # ---- phase 1: find the traceEvents array (or a bare top-level array)
        start = None
        bare = False
        while start is None:
            chunk = _read(stream, BLOCK_BYTES if head else 1 << 16, path)
            if not chunk and not head:
                raise TraceError(f"{path}: empty file; not a trace")
            head += chunk
            stripped = head.lstrip()
            if stripped[:1] == b"[":
                bare = True
                start = len(head) - len(stripped) + 1
                break
            if stripped and stripped[:1] != b"{":
                raise TraceError(f"{path}: not JSON (starts with {stripped[:20]!r}); expected a PyTorch profiler trace (.json or .json.gz)")
            start = _find_trace_events(head)
            if start is None and not chunk:
                try:
                    json.loads(head)
                except ValueError as exc:
                    raise TraceError(f"{path}: malformed JSON ({exc}) and no 'traceEvents' array found; not a trace") from exc
                raise TraceError(f"{path}: valid JSON but it has no 'traceEvents' array: not a PyTorch profiler trace "
                                 "(export with torch.profiler's export_chrome_trace / tensorboard_trace_handler)")
        prefix = b"" if bare else head[:start]
        rest = head[start:]
        # ---- phase 2: events
        frames: list[pl.DataFrame] = []
        total = len(head)
        consumed = start
        tail = None
        eof = False
        while tail is None:
            if rest:
                a = np.frombuffer(rest, np.uint8)
                pos, kind, depth = _structure(a)
                closes = kind == _CLOSE
                ends_arr = np.flatnonzero(closes & (depth == -1))
                if ends_arr.size:
                    cut_idx = ends_arr[0]
                    tail = rest[pos[cut_idx] + 1:]
                    upto = pos[cut_idx]  # the array's ']'
                    sel = slice(0, cut_idx)
                else:
                    ev_end = np.flatnonzero(closes & (depth == 0))
                    if ev_end.size and (eof or len(rest) > 0):
                        last = ev_end[-1]
                        upto = pos[last] + 1
                        sel = slice(0, last + 1)
                    else:
                        upto, sel = 0, slice(0, 0)
                if upto:
                    d = depth[sel]
                    k = kind[sel]
                    if (d < 0).any():
                        raise TraceError(f"{path}: malformed JSON in traceEvents near byte {consumed}; re-export the trace")
                    seps = pos[sel][(k == _COMMA) & (d == 0)]
                    block = rest[:upto]
                    if block.strip():
                        frames.append(_parse_block(block, seps, path, consumed))
                    consumed += upto
                    rest = rest[upto:]
                if tail is not None:
                    break
            if eof:
                raise TraceError(f"{path}: JSON ends inside the traceEvents array (truncated file?); re-copy or re-export the trace")
            chunk = _read(stream, BLOCK_BYTES, path)
            total += len(chunk)
            if not chunk:
                eof = True
            rest += chunk
        # ---- phase 3: metadata after the array
        while True:
            chunk = _read(stream, BLOCK_BYTES, path)
            if not chunk:
                break
            total += len(chunk)
            tail += chunk
    finally:
        stream.close()
    if bare:
        if tail.strip():
            raise TraceError(f"{path}: unexpected data after the top-level event array; the file is corrupt")
        meta = {}
    else:
        try:
            meta = json.loads(prefix + b"]" + tail)
        except ValueError as exc:
            raise TraceError(f"{path}: malformed JSON around the traceEvents array ({exc}); re-export the trace") from exc
        if not isinstance(meta, dict):
            raise TraceError(f"{path}: top-level JSON is not an object; not a trace")
        meta.pop("traceEvents", None)
    return frames, meta, total


def _find_trace_events(head: bytes) -> int | None:
    """Offset just after the '[' of the top-level "traceEvents" array, or None if not in head yet."""
    i = head.find(b'"traceEvents"')
    while i >= 0:
        a = np.frombuffer(head[:i], np.uint8)
        if a.size == 0:
            return None
        # the key must be at depth 1 of the top-level object and outside strings
        pos, kind, depth = _structure(a)
        quotes_before = _count_unescaped_quotes(a)
        if quotes_before % 2 == 0 and (depth[-1] if depth.size else 0) == 1:
            j = i + len(b'"traceEvents"')
            m = re.compile(rb"\s*:\s*").match(head, j)
            if m is None:
                return None
            k = m.end()
            if k >= len(head):
                return None
            if head[k:k + 1] != b"[":
                raise TraceError("'traceEvents' is not an array; not a PyTorch profiler trace")
            return k + 1
        i = head.find(b'"traceEvents"', i + 1)
    return None


def _count_unescaped_quotes(a: np.ndarray) -> int:
    q = np.flatnonzero(a == ord('"'))
    if q.size == 0:
        return 0
    if not (a == ord("\\")).any():
        return int(q.size)
    idx = np.arange(a.size)
    last_non_bs = np.maximum.accumulate(np.where(a != ord("\\"), idx, -1))
    prev = q - 1
    run = np.where(prev >= 0, prev - last_non_bs[np.maximum(prev, 0)], 0)
    return int(((run % 2) == 0).sum())


# ---------------------------------------------------------------- normalization
_CAT_MAP = {
    "cpu_op": "cpu_op", "operator": "cpu_op",
    "python_function": "python_function",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
    "cuda_runtime": "cuda_runtime", "runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver", "driver": "cuda_driver",
    "kernel": "kernel",
    "gpu_memcpy": "gpu_memcpy", "memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset", "memset": "gpu_memset",
    "cuda_sync": "cuda_sync",
}

# c10 ScalarType names (as NCCL metadata writes them) and Python/Input-type spellings -> bytes
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
    "c10::half": 2, "c10::bfloat16": 2, "int": 4, "int32": 4, "long": 8, "int64": 8, "long int": 8,
    "short": 2, "int16": 2, "byte": 1, "uint8": 1, "char": 1, "int8": 1, "signed char": 1,
    "unsigned char": 1, "bool": 1, "complexfloat": 8, "complexdouble": 16, "float8_e4m3fn": 1,
    "float8_e5m2": 1, "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1, "unsigned int": 4, "uint32": 4,
}

# normalized collective names: key = name lower-cased with everything but letters removed
_COLL = [
    ("reducescatter", "reduce_scatter"), ("allreduce", "allreduce"), ("allgather", "allgather"),
    ("alltoall", "all_to_all"), ("sendrecv", "send_recv"), ("broadcast", "broadcast"), ("bcast", "broadcast"),
    ("barrier", "barrier"), ("send", "send"), ("recv", "recv"), ("reduce", "reduce"), ("gather", "gather"),
    ("scatter", "scatter"),
]


def _collective_expr(src: pl.Expr) -> pl.Expr:
    key = src.str.to_lowercase().str.replace_all(r"[^a-z]", "")
    expr = pl.lit(None, pl.Utf8)
    for pat, norm in reversed(_COLL):
        expr = pl.when(key.str.contains(pat, literal=True)).then(pl.lit(norm)).otherwise(expr)
    return expr


def _us_text_to_ns(col: str) -> pl.Expr:
    """Microseconds as JSON number text -> exact integer ns (rounding below 1 ns)."""
    s = pl.col(col)
    sci = s.str.contains(r"[eE]")
    parts = s.str.split_exact(".", 1)
    ip = parts.struct.field("field_0").cast(pl.Int64, strict=False)
    frac = parts.struct.field("field_1").fill_null("")
    frac_ns = (frac + "000").str.slice(0, 3).cast(pl.Int64, strict=False)
    neg = s.str.starts_with("-")
    exact = ip * 1000 + pl.when(neg).then(-frac_ns).otherwise(frac_ns)
    return pl.when(sci).then((s.cast(pl.Float64, strict=False) * 1000).round(0).cast(pl.Int64)).otherwise(exact)


_COMM_NAME = r"(?i)^(nccl|rccl|gloo|c10d::|record_param_comms|ncclDevKernel|ncclKernel)"


def _normalize(raw: pl.DataFrame, base_ns: int) -> pl.DataFrame:
    a = pl.col("args")
    cat_l = pl.col("cat").str.to_lowercase()
    df = raw.with_row_index("event_id").filter(
        pl.col("ph").is_in(["X", "i", "I"]) & (cat_l != "trace") & pl.col("ts").is_not_null()
    )
    cat = cat_l.replace_strict(_CAT_MAP, default="other", return_dtype=pl.Utf8)
    dtype_in = a.struct.field("Input type").str.extract(r'^\[\s*"([^"]*)"', 1)
    dims0 = a.struct.field("Input Dims").str.extract(r"^\[\s*(\[[0-9,\s]*\])", 1)
    gpu_cat = ["kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync"]
    df = df.with_columns(
        cat=cat,
        ts_ns=_us_text_to_ns("ts") + base_ns,
        dur_ns=pl.when(pl.col("ph") == "X").then(_us_text_to_ns("dur")).otherwise(0).fill_null(0).clip(lower_bound=0),
        correlation=a.struct.field("correlation"),
        external_id=a.struct.field("External id"),
        _coll_name=a.struct.field("Collective name"),
        _in_nel=a.struct.field("In msg nelems"),
        _out_nel=a.struct.field("Out msg nelems"),
        dtype=pl.coalesce(a.struct.field("dtype"), dtype_in),
        group_size=a.struct.field("Group size").cast(pl.Int32),
        group_ranks=a.struct.field("Process Group Ranks"),
        pg_name=a.struct.field("Process Group Name"),
        sequence_number=a.struct.field("Sequence number"),
        fwd_thread_id=a.struct.field("Fwd thread id"),
        sync_kind=a.struct.field("cuda_sync_kind"),
        wait_on_stream=a.struct.field("wait_on_stream"),
        wait_on_event_corr=a.struct.field("wait_on_cuda_event_record_corr_id"),
        _dims_nel=dims0.str.extract_all(r"\d+").list.eval(pl.element().cast(pl.Int64)).list.eval(pl.element().product()).list.first(),
        _arg_stream=a.struct.field("stream").cast(pl.Int64, strict=False),
        _arg_device=a.struct.field("device"),
    )
    is_gpu = pl.col("cat").is_in(gpu_cat)
    dsize = pl.col("dtype").str.to_lowercase().replace_strict(_DTYPE_BYTES, default=None, return_dtype=pl.Int64)
    is_comm_name = pl.col("name").str.contains(_COMM_NAME)
    df = df.with_columns(
        end_ns=pl.col("ts_ns") + pl.col("dur_ns"),
        device=pl.when(is_gpu).then(pl.coalesce(pl.col("_arg_device"), pl.col("pid").cast(pl.Int64, strict=False))).cast(pl.Int32),
        stream=pl.when(is_gpu).then(pl.coalesce(pl.col("_arg_stream"), pl.col("tid").cast(pl.Int64, strict=False))),
        is_comm=(pl.col("_coll_name").is_not_null() | is_comm_name) & pl.col("cat").is_in(["kernel", "cpu_op", "user_annotation"]),
        msg_bytes=pl.coalesce(pl.col("_in_nel"), pl.col("_dims_nel")) * dsize,
        out_msg_bytes=pl.col("_out_nel") * dsize,
    )
    # collective names only for the (few) communication rows: string matching on every row is costly
    comm = df.filter(pl.col("is_comm")).select(
        "event_id",
        collective=pl.coalesce(_collective_expr(pl.col("_coll_name")),
                               _collective_expr(pl.col("name").str.replace(r"\(.*$", "").str.replace(r"(?i)_(RING|TREE|COLLNET|NVLS|PAT).*$", ""))),
    )
    df = df.join(comm, on="event_id", how="left", maintain_order="left")
    return df.drop([c for c in df.columns if c.startswith("_")] + ["args", "ts", "dur"])


_RANK_FROM_NAME = [re.compile(r"rank[-_]?(\d+)", re.I), re.compile(r"_(\d+)\.")]


def rank_from_file_name(name: str) -> int | None:
    for rx in _RANK_FROM_NAME:
        m = rx.search(name)
        if m:
            return int(m.group(1))
    return None


def read_trace(path: str | Path, capture_id: str = "", rank: int | None = None) -> TraceFile:
    """Read one rank's profiler trace (.json or .json.gz, GPU / CPU-only / ROCm) into trace_events.

    rank: given -> used; else distributedInfo.rank; else from the file name (`rank3`, `_3.`); else 0
    (meta['rank_source'] says which). Raises TraceError with an actionable message when the file is
    not a readable trace."""
    path = Path(path)
    frames, meta, nbytes = _scan_events(path)
    dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else None
    if rank is not None:
        r, src = int(rank), "argument"
    elif dist is not None and isinstance(dist.get("rank"), int):
        r, src = int(dist["rank"]), "distributedInfo"
    elif (fr := rank_from_file_name(path.name)) is not None:
        r, src = fr, "file_name"
    else:
        r, src = 0, "default"
    base_ns = meta.get("baseTimeNanoseconds")
    base_ns = int(base_ns) if isinstance(base_ns, (int, float)) and base_ns else 0
    raw = pl.concat(frames, how="vertical") if frames else pl.DataFrame(schema=_READ_SCHEMA)
    n_raw = raw.height
    ev = _normalize(raw, base_ns)
    del raw
    ev = ev.with_columns(
        capture_id=pl.lit(capture_id, pl.Utf8),
        rank=pl.lit(r, pl.Int32),
        source_file=pl.lit(str(path), pl.Utf8),
        event_id=pl.col("event_id").cast(pl.Int64),
    )
    ev = TRACE_EVENTS.validate(conform(ev, TRACE_EVENTS))
    info = {
        "schemaVersion": meta.get("schemaVersion"),
        "distributedInfo": dist,
        "deviceProperties": meta.get("deviceProperties", []),
        "baseTimeNanoseconds": base_ns or None,
        "rank": r,
        "rank_source": src,
        "n_raw_events": n_raw,
        "n_events": ev.height,
        "n_other_phases": n_raw - ev.height,  # metadata (M), flow arrows (s/f), profiler spans
        "text_bytes": nbytes,
        "is_gpu": bool(ev.filter(pl.col("cat").is_in(["kernel", "gpu_memcpy", "gpu_memset"])).height),
        "other_keys": {k: v for k, v in meta.items() if k not in ("distributedInfo", "deviceProperties", "schemaVersion")},
    }
    return TraceFile(ev, info, str(path))


TRACE_SUFFIXES = (".json", ".json.gz")


def trace_files(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES) and p.name != "capture.json")


def read_capture(folder: str | Path, capture_id: str | None = None) -> pl.DataFrame:
    """All ranks' traces of one capture folder, concatenated (capture_id defaults to the folder name).
    A file that is not a trace raises TraceError naming it; two files claiming the same rank too."""
    folder = Path(folder)
    cid = capture_id if capture_id is not None else folder.name
    files = trace_files(folder)
    if not files:
        raise TraceError(f"{folder}: no *.json / *.json.gz traces in the capture folder")
    out, seen = [], {}
    for f in files:
        tf = read_trace(f, cid)
        r = tf.meta["rank"]
        if r in seen:
            raise TraceError(f"{folder}: {seen[r].name} and {f.name} are both rank {r}; keep one trace per rank")
        seen[r] = f
        out.append(tf.events)
    return pl.concat(out, how="vertical")
