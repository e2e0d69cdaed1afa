"""Fast, bounded-memory reader of PyTorch profiler (Kineto) Chrome traces into the `trace_events` table.

Why not json.load: a Python dict per event is what makes HTA slow and memory hungry. Here the file is
decompressed in blocks (python-isal: ISA-L's inflate, ~2x zlib), msgspec (a C JSON decoder) validates
each block and cuts it into whole events of the `traceEvents` array (`list[msgspec.Raw]`: the raw
text of each event, no Python objects per field), the events go one per line to polars' native NDJSON
reader, which parses only the fields we need into columns; a reader thread cuts the next block while
this one is parsed, and each block is normalized at once. Memory is a block or two of text plus the
columnar result; the metadata around the array (distributedInfo, deviceProperties,
baseTimeNanoseconds, ...) is small and parsed with json.

The JSON library was chosen by measurement (`python -m benchmarks.traces_vs_hta --json-libs`,
docs/figures/traces.md): the same columns from a 218 K-event A100 trace took 0.35 CPU-s with msgspec
cutting + polars NDJSON, 0.52 with msgspec decoding typed structs (a Python object per event, then
columns), 1.55 with orjson (dicts), 1.74 with json and 2.24 with pysimdjson (a fast parse, but every
field read back through Python); the numpy scanner it replaces cost about as much as the parse.

Timestamps are microseconds in the file: the integer part converts exactly, the fraction rounds to
the nearest ns (newer Kineto writes them relative to `baseTimeNanoseconds`, which is added)."""
from __future__ import annotations

import json
import multiprocessing
import os
import queue
import re
import threading
import zlib
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np
import polars as pl
from isal import isal_zlib

from fleetscope.common import collective_expr
from fleetscope.ingest.trace_scan import END as SCAN_END, FALLBACK as SCAN_FALLBACK, MORE as SCAN_MORE, Scanner
from fleetscope.schemas.base import conform
from fleetscope.schemas.landing import TRACE_EVENTS

BLOCK_BYTES = 8 << 20  # decompressed text per parse block (the bound on memory per file being read)
NORMALIZE_ROWS = 500_000  # events parsed before they are normalized together (a polars query costs per call)
FAST_SCAN = True  # blocks through the compiled scanner (fleetscope.ingest.trace_scan) where it reads them
PARALLEL_MIN_BYTES = 8 << 20  # below this much (compressed) in a capture, starting processes costs more than it saves
# with fewer cores one process already keeps them busy (a reader thread cuts blocks while polars' threads
# parse): on 2 cores 16 ranks x 218 K events took 10.9 s in one process, 12.9 s in two (docs/figures/traces.md)
PARALLEL_MIN_CORES = 4


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
class _GzipStream:
    """gzip decompression straight through ISA-L's inflate (python-isal: zlib's API, about twice its
    speed; less per-block overhead than the gzip module); handles concatenated members and reports a
    truncated stream at EOF."""

    def __init__(self, path: Path):
        self._fh = open(path, "rb")
        self._d = isal_zlib.decompressobj(31)
        self._path = path

    def read(self, n: int) -> bytes:
        out = []
        size = 0
        while size < n:
            raw = self._d.unconsumed_tail or self._fh.read(1 << 20)
            if not raw:
                if not self._d.eof:
                    raise EOFError("compressed file ended before the end-of-stream marker was reached")
                break
            if self._d.eof:  # next gzip member
                rest = self._d.unused_data + raw if self._d.unused_data else raw
                self._d = isal_zlib.decompressobj(31)
                raw = rest
            piece = self._d.decompress(raw, n - size)
            out.append(piece)
            size += len(piece)
            if self._d.eof and self._d.unused_data:
                rest = self._d.unused_data
                self._d = isal_zlib.decompressobj(31)
                piece = self._d.decompress(rest, max(n - size, 1))
                out.append(piece)
                size += len(piece)
        return b"".join(out)

    def close(self) -> None:
        self._fh.close()


def _open_stream(path: Path):
    """Binary stream of the decompressed file (gzip detected by magic, not by extension)."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(2)
    except OSError as exc:
        raise TraceError(f"{path}: cannot open ({exc})") from exc
    if magic == b"\x1f\x8b":
        return _GzipStream(path)
    return open(path, "rb")


def _read(stream, n: int, path: Path) -> bytes:
    try:
        return stream.read(n)
    except EOFError as exc:
        raise TraceError(f"{path}: truncated gzip file ({exc}); the copy is incomplete, re-copy or re-export the trace") from exc
    except (zlib.error, isal_zlib.error, OSError) as exc:
        raise TraceError(f"{path}: corrupt gzip data ({exc}); re-copy or re-export the trace") from exc


_READ_SCHEMA = {
    "ph": pl.Utf8,
    "cat": pl.Utf8,
    "name": pl.Utf8,
    "pid": pl.Utf8,
    "tid": pl.Utf8,
    "ts": pl.Float64,
    "dur": pl.Float64,
    # only the args every event may carry; each extra field costs parse time on every event, so the
    # rare ones (NCCL metadata, sync details) are read from the few events that have them (_rare_args)
    "args": pl.Struct({
        "External id": pl.Int64,
        "correlation": pl.Int64,
        "device": pl.Int64,
        "stream": pl.Utf8,  # an int on GPU events, "0x0" on hip runtime calls
        "Sequence number": pl.Int64,
        "Fwd thread id": pl.Int64,
    }),
}
_RARE_KEYS = {  # args key -> column
    "cuda_sync_kind": "sync_kind",
    "wait_on_stream": "wait_on_stream",
    "wait_on_cuda_event_record_corr_id": "wait_on_event_corr",
    "Collective name": "_coll_name",
    "In msg nelems": "_in_nel",
    "Out msg nelems": "_out_nel",
    "Group size": "group_size",
    "dtype": "dtype",
    "Process Group Name": "pg_name",
    "Process Group Ranks": "group_ranks",
    "Input Dims": "_in_dims",
    "Input type": "_in_type",
    "Dst Rank": "_dst_rank",  # point-to-point peers (newer Kineto writes them on send / recv metadata)
    "Src Rank": "_src_rank",
    "Concrete Inputs": "_concrete",  # c10d::send / c10d::recv_ (with record_shapes): the peer is their 3rd argument
}
_RARE_SCHEMA = {
    "event_id": pl.Int64, "sync_kind": pl.Utf8, "wait_on_stream": pl.Int64, "wait_on_event_corr": pl.Int64,
    "_coll_name": pl.Utf8, "_in_nel": pl.Int64, "_out_nel": pl.Int64, "group_size": pl.Int32, "dtype": pl.Utf8,
    "pg_name": pl.Utf8, "group_ranks": pl.Utf8, "_in_dims": pl.Utf8, "_in_type": pl.Utf8, "_dst_rank": pl.Int64,
    "_src_rank": pl.Int64, "_concrete": pl.Utf8,
    "weight_bytes": pl.Int64,
}
_COMM_NAME = r"(?i)^(nccl|rccl|gloo|c10d::|record_param_comms|ncclDevKernel|ncclKernel)"
_COMM_PREFIXES = ("nccl", "NCCL", "Nccl", "rccl", "RCCL", "gloo", "Gloo", "GLOO", "c10d::", "record_param_comms")


def _to_int(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _rare_args(df: pl.DataFrame, raws: list, first_id: int, rows: dict) -> None:
    """Args of the few events that carry collective metadata or sync details, decoded from their own
    raw text (the rows are: cuda_sync events and operators/kernels named like a collective), appended
    to rows (columns of _RARE_SCHEMA)."""
    n = pl.col("name")
    need = df.select(
        (pl.col("cat").str.to_lowercase() == "cuda_sync")
        # prefixes, not a regex: this runs on every event of the trace
        | (pl.any_horizontal([n.str.starts_with(p) for p in _COMM_PREFIXES]) & pl.col("ph").is_in(["X", "i", "I"]))
        | n.is_in(list(_WEIGHT_INPUTS))
    ).to_series().fill_null(False).to_numpy()
    idx = np.flatnonzero(need)
    names = df["name"].gather(idx).to_list() if idx.size else []
    for i, name in zip(idx.tolist(), names):
        try:
            args = _ARGS.decode(raws[i]).args or {}
        except (msgspec.DecodeError, msgspec.ValidationError):
            args = {}
        rows["event_id"].append(first_id + i)
        for key, col in _RARE_KEYS.items():
            v = args.get(key)
            if _RARE_SCHEMA[col] in (pl.Int64, pl.Int32):
                v = _to_int(v)
            elif v is not None and not isinstance(v, str):
                v = json.dumps(v)
            rows[col].append(v)
        rows["weight_bytes"].append(_weight_bytes(name, args))


# model operators whose inputs include the layer's parameters: operator -> the positions of its weight
# (and bias) among its inputs; record_shapes gives their shapes and types (the gradient volume a
# data-parallel what-if reduces)
_WEIGHT_INPUTS = {"aten::linear": (1, 2), "aten::conv1d": (1, 2), "aten::conv2d": (1, 2), "aten::conv3d": (1, 2),
                  "aten::embedding": (0,), "aten::layer_norm": (2, 3), "aten::group_norm": (2, 3), "aten::batch_norm": (1, 2),
                  "aten::rms_norm": (2,)}


def _weight_bytes(name: str, args: dict) -> int | None:
    pos = _WEIGHT_INPUTS.get(name)
    dims, types = args.get("Input Dims"), args.get("Input type")
    if pos is None or not isinstance(dims, list) or not isinstance(types, list):
        return None
    total = 0
    for p in pos:
        if p < len(dims) and p < len(types) and isinstance(dims[p], list) and dims[p] and all(isinstance(x, int) for x in dims[p]):
            b = _DTYPE_BYTES.get(str(types[p]).lower())
            if b:
                total += int(np.prod(dims[p])) * b
    return total or None


class _WithArgs(msgspec.Struct):
    args: dict | None = None


_ARGS = msgspec.json.Decoder(_WithArgs)
_RAW_EVENTS = msgspec.json.Decoder(list[msgspec.Raw])
_NEXT_EVENT = re.compile(rb"\s*(?:,\s*\{|\])")
_ERR_AT = re.compile(r"\(byte (\d+)\)")


def _split_events(text: bytes, first: bool, eof: bool, path: Path, offset: int):
    """Whole events at the start of `text`, which begins right after the traceEvents array's '[' (first)
    or right after an event already taken. Returns (consumed, events text as JSON lines | None, raws,
    tail | None): tail is the text after the array's closing ']' once it is reached.

    msgspec does the work: candidate cuts are the last '}' followed by `, {` or `]`; the text up to a
    candidate decodes as a JSON array of raw events only when the cut is between two events of the
    array (a cut inside a string, a nested object or the metadata after the array does not decode), so
    a successful decode both finds the boundary and validates every event's JSON."""
    j = len(text) - len(text.lstrip())
    if text[j:j + 1] == b"]":
        return j + 1, None, [], text[j + 1:]
    if not first:
        if not text[j:j + 1]:
            return 0, None, [], None
        if text[j:j + 1] != b",":
            raise TraceError(f"{path}: malformed JSON between events of traceEvents near byte {offset + j}: expected ',' or ']'; "
                             "re-export the trace")
        j += 1
    body = text[j:]
    c = len(body)
    bad = None  # (position, message) of malformed JSON inside what was read
    for _ in range(4096):
        c = body.rfind(b"}", 0, c)
        if c < 0:
            break
        if not _NEXT_EVENT.match(body, c + 1):
            continue
        chunk = body[:c + 1].translate(_WS_TO_SPACE)  # raw newlines are never inside JSON strings
        try:
            raws = _RAW_EVENTS.decode(b"[" + chunk + b"]")
        except msgspec.DecodeError as exc:
            # a cut inside an event fails at the end (truncated, or at the ']' appended); a failure
            # before the end is malformed JSON there: only a cut before it can still decode
            m = _ERR_AT.search(str(exc))
            if m and int(m.group(1)) < len(chunk):
                bad = (int(m.group(1)) - 1, str(exc))
                c = min(c, bad[0])
            continue
        nd = b"\n".join(raws)
        if nd[:1] != b"{" or nd.count(b"\n{") != len(raws) - 1:
            raise TraceError(f"{path}: malformed traceEvents near byte {offset}: the array must hold JSON objects; re-export the trace")
        return j + c + 1, nd, raws, None
    if bad is not None:
        raise TraceError(f"{path}: malformed JSON in traceEvents near byte {offset + j + bad[0]} ({bad[1]}); the file is corrupt, "
                         "re-export it")
    if not eof:
        return 0, None, [], None  # no whole event yet: read more
    try:
        _RAW_EVENTS.decode(b"[" + body.translate(_WS_TO_SPACE))
        why = "it does not close"
    except msgspec.DecodeError as exc:
        why = str(exc)
    if "truncated" in why or why == "it does not close":
        raise TraceError(f"{path}: JSON ends inside the traceEvents array (truncated file?); re-copy or re-export the trace")
    raise TraceError(f"{path}: malformed JSON in traceEvents after byte {offset + j} ({why}); the file is corrupt, re-export it")


def _cut(text: bytes, first: bool, eof: bool, path: Path, offset: int, scanner: Scanner | None):
    """_split_events, through the compiled scanner (fleetscope.ingest.trace_scan) when it reads the text:
    then the events come as a parsed frame (the NDJSON read's columns) with their raw text by position.
    A block holding anything it does not read (or an error) goes to the general path whole, from its
    start: that path reads it, or refuses the file with the same words as without the scanner."""
    if scanner is not None:
        st, consumed, frame, spans, end = scanner.scan(text, first)
        if frame is not None and st != SCAN_FALLBACK:
            return consumed, frame, spans, None
        if st == SCAN_END:
            return end, None, [], text[end:]
        if st == SCAN_MORE and not eof:
            return 0, None, [], None
    return _split_events(text, first, eof, path, offset)


def _parse_block(nd: bytes, path: Path, offset: int) -> pl.DataFrame:
    try:
        return pl.read_ndjson(nd, schema=_READ_SCHEMA, ignore_errors=True)
    except Exception as exc:  # polars raises ComputeError with the parser's message
        raise TraceError(f"{path}: malformed JSON in traceEvents near byte {offset}: {exc}; the file is corrupt, re-export it") from exc


def _scan_events(path: Path) -> tuple[list[pl.DataFrame], tuple[int, int], dict, int]:
    """Stream the file: normalized event frames (times before baseTimeNanoseconds), (raw events,
    events without timestamp), the metadata dict and the number of text bytes."""
    stream = _open_stream(path)
    try:
        head = b""
        # ---- phase 1: find the traceEvents array (or a bare top-level array)
        start = None
        bare = False
        while start is None:
            chunk = _read(stream, BLOCK_BYTES if head else min(BLOCK_BYTES, 1 << 16), path)
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
        # ---- phase 2 and 3: a reader thread decompresses and cuts blocks of whole events while this
        # thread parses the previous block (zlib, numpy and polars release the GIL); the queue bound
        # keeps at most a few blocks of text in memory
        q: queue.Queue = queue.Queue(maxsize=1)
        stop = threading.Event()
        reader = threading.Thread(target=_cut_blocks, args=(stream, head[start:], start, len(head), path, q, stop), daemon=True)
        reader.start()
        frames: list[pl.DataFrame] = []
        n_seen = 0
        n_no_ts = 0
        pending: list[pl.DataFrame] = []  # parsed blocks not normalized yet
        rare: dict = {c: [] for c in _RARE_SCHEMA}
        first_pending = 0

        def flush():
            # normalize a batch of blocks at once (times relative to baseTimeNanoseconds, which Kineto
            # writes after the array): a polars query has a fixed cost per call, and only the compact
            # result of earlier batches stays in memory
            nonlocal pending, rare, first_pending, n_no_ts
            if not pending:
                return
            raw = pl.concat(pending, how="vertical_relaxed") if len(pending) > 1 else pending[0]
            n_no_ts += raw.filter(pl.col("ph").is_in(["X", "i", "I"]) & pl.col("ts").is_null()).height
            frames.append(_normalize(raw, pl.DataFrame(rare, schema=_RARE_SCHEMA) if rare["event_id"] else None, 0, first_pending))
            pending, rare, first_pending = [], {c: [] for c in _RARE_SCHEMA}, n_seen

        try:
            while True:
                item = q.get()
                if item[0] == "error":
                    raise item[1]
                if item[0] == "end":
                    _, tail, total = item
                    break
                _, nd, raws, offset = item
                df = nd if isinstance(nd, pl.DataFrame) else _parse_block(nd, path, offset)
                if df.height != len(raws):
                    raise TraceError(f"{path}: malformed traceEvents near byte {offset}; re-export the trace")
                _rare_args(df, raws, n_seen, rare)
                del nd, raws
                pending.append(df)
                n_seen += df.height
                if n_seen - first_pending >= NORMALIZE_ROWS:
                    flush()
            flush()
        finally:
            stop.set()
            while reader.is_alive():  # unblock a reader waiting on a full queue
                try:
                    q.get_nowait()
                except queue.Empty:
                    pass
                reader.join(0.01)
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
    return frames, (n_seen, n_no_ts), meta, total


def _cut_blocks(stream, rest: bytes, consumed: int, total: int, path: Path, q: queue.Queue, stop: threading.Event) -> None:
    """Reader thread: whole events as NDJSON blocks onto q, then ("end", text after the array, bytes read)."""
    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    try:
        scanner = Scanner() if FAST_SCAN else None
        tail = None
        eof = False
        first = True
        while tail is None:
            if rest or eof:
                used, nd, raws, tail = _cut(rest, first, eof, path, consumed, scanner)
                if nd is not None:
                    first = False
                    if not put(("block", nd, raws, consumed)):
                        return
                if used:
                    consumed += used
                    rest = rest[used:]
                if tail is not None:
                    break
                if used:
                    continue  # more whole events (or the array's end) may be in what is left
            if eof:
                raise TraceError(f"{path}: JSON ends inside the traceEvents array (truncated file?); re-copy or re-export the trace")
            chunk = _read(stream, BLOCK_BYTES, path)
            total += len(chunk)
            if not chunk:
                eof = True
            rest += chunk
        while True:  # metadata after the array
            chunk = _read(stream, BLOCK_BYTES, path)
            if not chunk:
                break
            total += len(chunk)
            tail += chunk
        put(("end", tail, total))
    except BaseException as exc:  # noqa: BLE001 - handed to the parsing thread
        put(("error", exc))


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

def _us_to_ns(col: str) -> pl.Expr:
    """Microseconds (float64) -> integer ns. The integer part converts exactly (absolute epoch
    microseconds are exact in float64); the fraction rounds to the nearest ns (relative timestamps
    with 3 decimals, as newer Kineto writes them next to baseTimeNanoseconds, keep their ns)."""
    v = pl.col(col)
    whole = v.floor()
    return whole.cast(pl.Int64) * 1000 + ((v - whole) * 1000).round(0).cast(pl.Int64)


def _normalize(raw: pl.DataFrame, rare: pl.DataFrame | None, base_ns: int, first_id: int = 0) -> pl.DataFrame:
    """Raw event columns -> trace_events columns (one lazy query so polars fuses the passes)."""
    a = pl.col("args")
    cat_l = pl.col("cat").str.to_lowercase()
    gpu_cat = ["kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync"]
    is_gpu = pl.col("cat").is_in(gpu_cat)
    lf = (
        raw.lazy()
        .with_row_index("event_id", offset=first_id)
        .filter(pl.col("ph").is_in(["X", "i", "I"]) & (cat_l != "trace") & pl.col("ts").is_not_null())
        .with_columns(
            cat=cat_l.replace_strict(_CAT_MAP, default="other", return_dtype=pl.Utf8),
            ts_ns=_us_to_ns("ts") + base_ns,
            dur_ns=pl.when(pl.col("ph") == "X").then(_us_to_ns("dur")).otherwise(0).fill_null(0).clip(lower_bound=0),
            correlation=a.struct.field("correlation"),
            external_id=a.struct.field("External id"),
            sequence_number=a.struct.field("Sequence number"),
            fwd_thread_id=a.struct.field("Fwd thread id"),
            _arg_stream=a.struct.field("stream").cast(pl.Int64, strict=False),
            _arg_device=a.struct.field("device"),
        )
        .with_columns(
            end_ns=pl.col("ts_ns") + pl.col("dur_ns"),
            device=pl.when(is_gpu).then(pl.coalesce(pl.col("_arg_device"), pl.col("pid").cast(pl.Int64, strict=False))).cast(pl.Int32),
            stream=pl.when(is_gpu).then(pl.coalesce(pl.col("_arg_stream"), pl.col("tid").cast(pl.Int64, strict=False))),
        )
        .drop(["args", "ts", "dur", "_arg_stream", "_arg_device"])
    )
    if rare is None or rare.height == 0:
        rare = pl.DataFrame(schema=_RARE_SCHEMA)
    # collective metadata: from NCCL args, else the op's first input tensor (nccl:all_reduce, gloo:...)
    dims0 = pl.col("_in_dims").str.extract(r"^\[\s*(\[[0-9,\s]*\])", 1)
    dtype_in = pl.col("_in_type").str.extract(r'^\[\s*"([^"]*)"', 1)
    rare_lf = rare.lazy().with_columns(
        dtype=pl.coalesce(pl.col("dtype"), dtype_in),
        _dims_nel=dims0.str.extract_all(r"\d+").list.eval(pl.element().cast(pl.Int64).product()).list.first(),
    )
    lf = lf.join(rare_lf, on="event_id", how="left", maintain_order="left")
    dsize = pl.col("dtype").str.to_lowercase().replace_strict(_DTYPE_BYTES, default=None, return_dtype=pl.Int64)
    is_comm = ((pl.col("_coll_name").is_not_null() | pl.col("name").str.contains(_COMM_NAME))
               & pl.col("cat").is_in(["kernel", "cpu_op", "user_annotation"])).fill_null(False)
    lf = lf.with_columns(is_comm=is_comm).with_columns(
        msg_bytes=pl.when(pl.col("is_comm")).then(pl.coalesce(pl.col("_in_nel"), pl.col("_dims_nel")) * dsize),
        out_msg_bytes=pl.when(pl.col("is_comm")).then(pl.col("_out_nel") * dsize),
    )
    df = lf.collect()
    # collective names only for the (few) communication rows: string matching on every row is costly
    comm = df.filter(pl.col("is_comm")).select(
        "event_id",
        collective=pl.coalesce(
            collective_expr(pl.col("_coll_name")),
            collective_expr(pl.col("name").str.replace(r"\(.*$", "").str.replace(r"(?i)_(RING|TREE|COLLNET|NVLS|PAT).*$", ""))),
        _dst=pl.col("_dst_rank"), _src=pl.col("_src_rank"),
        # c10d::send(tensors, group, dstRank, tag) / c10d::recv_(tensors, group, srcRank, tag): the peer's rank in
        # the group the op ran in (the global rank for the default group)
        _arg=pl.when(pl.col("name").str.contains(r"^c10d::(send|recv_|isend|irecv)$"))
        .then(pl.col("_concrete").str.extract(r'^\[\s*"[^"]*"\s*,\s*"[^"]*"\s*,\s*"(\d+)"', 1).cast(pl.Int64, strict=False)),
    ).with_columns(peer=pl.when(pl.col("collective") == "send").then(pl.coalesce("_dst", "_arg")).when(pl.col("collective") == "recv")
                   .then(pl.coalesce("_src", "_arg")).cast(pl.Int32)).drop("_dst", "_src", "_arg")
    df = df.join(comm, on="event_id", how="left", maintain_order="left")
    return df.drop([c for c in df.columns if c.startswith("_")])


# The documented naming rule for a trace without distributedInfo: `rank<R>`, `rank_<R>` or `rank-<R>`
# in the file name (not after a letter). Nothing looser: a bare number in a name is usually Kineto's
# pid (`host_pid.ts.pt.trace.json`), and a pid taken for a rank silently mixes ranks up.
_RANK_FROM_NAME = re.compile(r"(?<![a-z])rank[-_]?(\d+)(?!\d)", re.I)


def rank_from_file_name(name: str) -> int | None:
    m = _RANK_FROM_NAME.search(name)
    return int(m.group(1)) if m else None


def read_trace(path: str | Path, capture_id: str = "", rank: int | None = None) -> TraceFile:
    """Read one rank's profiler trace (.json or .json.gz, GPU / CPU-only / ROCm) into trace_events.

    rank: given -> used; else distributedInfo.rank (torch.profiler writes it whenever
    torch.distributed is initialized); else the naming rule (`rank3`, `rank_3`, `rank-3` in the file
    name); else, for a trace with no distributedInfo and no communication at all (a single-process
    run), 0; else TraceError (a distributed rank whose rank cannot be known is quarantined, never
    guessed from a pid). meta['rank_source'] says which. Raises TraceError with an actionable
    message when the file is not a readable trace."""
    path = Path(path)
    frames, (n_raw, n_no_ts), meta, nbytes = _scan_events(path)
    dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else None
    if rank is not None:
        r, src = int(rank), "argument"
    elif dist is not None and isinstance(dist.get("rank"), int):
        r, src = int(dist["rank"]), "distributedInfo"
    elif (fr := rank_from_file_name(path.name)) is not None:
        r, src = fr, "file_name"
    elif dist is None and not any(f["is_comm"].any() for f in frames):
        r, src = 0, "single_process"
    else:
        why = ("its distributedInfo has no rank" if dist is not None
               else "it has no distributedInfo although it holds collectives (a rank of a distributed job)")
        raise TraceError(f"{path}: cannot tell which rank this trace is: {why}, and its file name follows no rank rule; "
                         "rename it rank<R>.json(.gz) (also rank_<R>, rank-<R>), or export it from a process where "
                         "torch.distributed is initialized (the profiler then writes distributedInfo.rank)")
    base_ns = meta.get("baseTimeNanoseconds")
    base_ns = int(base_ns) if isinstance(base_ns, (int, float)) and base_ns else 0
    ev = pl.concat(frames, how="vertical_relaxed") if frames else _normalize(pl.DataFrame(schema=_READ_SCHEMA), None, 0)
    del frames
    if base_ns:
        ev = ev.with_columns(pl.col("ts_ns") + base_ns, pl.col("end_ns") + base_ns)
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
        "n_other_phases": n_raw - ev.height - n_no_ts,  # metadata (M), flow arrows (s/f), profiler spans
        "n_without_timestamp": n_no_ts,
        "text_bytes": nbytes,
        "is_gpu": bool(ev.filter(pl.col("cat").is_in(["kernel", "gpu_memcpy", "gpu_memset"])).height),
        "other_keys": {k: v for k, v in meta.items() if k not in ("distributedInfo", "deviceProperties", "schemaVersion")},
    }
    return TraceFile(ev, info, str(path))


def _read_or_error(path: str, capture_id: str, spool: str | None = None):
    """read_trace, or the error saying why the file is not a readable trace. With spool (in a spawned
    process), the events go to an Arrow IPC file there and the TraceFile carries its path: mapping it
    back costs nothing, where pickling the frame through the pipe costs as much as parsing it."""
    try:
        tf = read_trace(path, capture_id)
    except (TraceError, OSError) as exc:
        return exc
    except ValueError as exc:  # e.g. a schema check: the file's content is wrong, say so
        return TraceError(f"{path}: {exc}")
    if spool is not None:
        out = os.path.join(spool, f"{os.getpid()}-{abs(hash(path))}.arrow")
        tf.events.write_ipc(out, compression="uncompressed")
        tf.events = out
    return tf


@contextmanager
def _env(**values: str):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def read_traces(paths: list, capture_id: str = "", processes: int | None = None) -> list:
    """read_trace over the files of a capture, spread over the cores: one spawned process per core
    (polars is not fork-safe), each with its share of polars' threads; results in the order of paths,
    a TraceFile or the TraceError / OSError saying why the file is not a readable trace. Small
    captures (< PARALLEL_MIN_BYTES) and machines with < PARALLEL_MIN_CORES cores read here: starting
    processes would cost more. FLEETSCOPE_TRACE_PROCESSES overrides the number of processes."""
    paths = [Path(p) for p in paths]
    cores = os.cpu_count() or 1
    if processes is None and os.environ.get("FLEETSCOPE_TRACE_PROCESSES", "").isdigit():
        processes = int(os.environ["FLEETSCOPE_TRACE_PROCESSES"])
    n = (min(len(paths), cores) if cores >= PARALLEL_MIN_CORES else 1) if processes is None else max(1, min(processes, len(paths)))
    size = sum(p.stat().st_size for p in paths if p.exists())
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if n <= 1 or (processes is None and size < PARALLEL_MIN_BYTES) or (main is not None and not os.path.exists(main)):
        # (a spawned process cannot start when the main program is not a file: python - < script)
        return [_read_or_error(str(p), capture_id) for p in paths]
    with tempfile.TemporaryDirectory(prefix="fleetscope-traces-") as spool:
        try:
            with _env(POLARS_MAX_THREADS=str(max(1, cores // n))):  # read by the spawned processes as they start
                with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")) as ex:
                    out = [f.result() for f in [ex.submit(_read_or_error, str(p), capture_id, spool) for p in paths]]
        except BrokenProcessPool:  # a process died (out of memory?): read here, one file at a time
            return [_read_or_error(str(p), capture_id) for p in paths]
        for tf in out:
            if isinstance(tf, TraceFile):  # into this process' memory before the spool goes
                tf.events = pl.read_ipc(tf.events)
        return out


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
