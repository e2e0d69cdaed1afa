"""A compiled scanner (numba) of the `traceEvents` array of a Kineto trace: whole events at the start of a
block of text, checked as JSON and read into the columns fleetscope.ingest.traces needs, in one pass.

Why: the general path (msgspec cuts the block into raw events and checks their JSON, polars' NDJSON
reader parses them again into columns) tokenizes every byte twice and was most of a trace's reading
time (0.37 + 0.72 CPU-s for a 46 MB rank file; this pass: ~0.3 CPU-s, columns included).

What it reads: each event's ph, cat, name (text or null), pid, tid (text, or an integer's digits, as
polars reads a number into a text column), ts, dur (numbers), and from args: External id,
correlation, device, Sequence number, Fwd thread id (integers), stream (text or an integer's digits);
every other member is checked as JSON and skipped. It gives up on a block (FALLBACK: the caller
takes the general path for the whole block, which reads it or raises its own error, so bad input is
treated as before) at anything it does not read the general path's way: malformed JSON, an element
that is not an object, non-ASCII bytes or \\u escapes anywhere, escapes in a value it reads, a key
it reads twice, values of another type (a float id, a boolean name), an integer beyond 18 digits.
Numbers: integers are exact; decimals exact in float64 by Clinger's fast path (at most 2^53 over a
power of ten up to 10^22, one correctly rounded division); other numbers of ts / dur are converted
afterwards by Python's float() (correctly rounded, as polars' reader is), marked on the side."""
from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
from numba import njit

OK, MORE, END, FALLBACK = 0, 1, 2, 3
K_PH, K_CAT, K_NAME, K_PID, K_TID, K_TS, K_DUR, K_ARGS = range(8)  # top-level members read
A_EXT, A_CORR, A_DEV, A_STREAM, A_SEQ, A_FWD = range(6)  # args members read
ARG_NAMES = (b"External id", b"correlation", b"device", b"stream", b"Sequence number", b"Fwd thread id")
_AN = np.frombuffer(b"".join(ARG_NAMES), np.uint8).copy()
_AS = np.cumsum([0] + [len(x) for x in ARG_NAMES[:-1]]).astype(np.int64)
_AL = np.array([len(x) for x in ARG_NAMES], np.int64)
S_STREAM = 5  # text fields: ph cat name pid tid (as K_*) and stream
_POW10 = np.array([10.0 ** k for k in range(23)])
_MAX_EXACT = 9007199254740992  # 2^53


@njit(cache=True, inline="always")
def _ws(b, i, n):
    while i < n:
        c = b[i]
        if c == 32 or c == 10 or c == 13 or c == 9:
            i += 1
        else:
            break
    return i


@njit(cache=True)
def _string_end(b, i, n):
    """b[i] is a string's opening quote -> (index after its closing quote, holds escapes): -1 when the
    buffer ends first, -2 when this scanner does not read it (invalid, non-ASCII, a \\u escape)."""
    i += 1
    esc = False
    while i < n:
        c = b[i]
        if c == 34:
            return i + 1, esc
        if c == 92:
            esc = True
            if i + 1 >= n:
                return -1, esc
            e = b[i + 1]
            if e == 34 or e == 92 or e == 47 or e == 98 or e == 102 or e == 110 or e == 114 or e == 116:
                i += 2
                continue
            return -2, esc  # \u escapes (surrogates) and invalid escapes: the general path's rules
        if c < 32 or c >= 128:
            return -2, esc
        i += 1
    return -1, esc


@njit(cache=True)
def _number(b, i, n):
    """The JSON number at i -> (end, kind, integer, float): kind 0 invalid, 1 an integer (exact, its float
    correctly rounded), 2 a decimal whose float is exact by the fast path, 3 valid, converted later; end
    -1 when the buffer ends first (a number may go on in the next block)."""
    j = i
    neg = False
    if j < n and b[j] == 45:
        neg = True
        j += 1
    if j >= n:
        return -1, 0, 0, 0.0
    if not (48 <= b[j] <= 57):
        return j, 0, 0, 0.0
    m = 0
    digits = 0
    frac = 0
    if b[j] == 48:
        j += 1
        if j < n and 48 <= b[j] <= 57:
            return j, 0, 0, 0.0  # a leading zero
    else:
        while j < n and 48 <= b[j] <= 57:
            if digits < 18:
                m = m * 10 + (b[j] - 48)
            digits += 1
            j += 1
    if j < n and b[j] == 46:
        j += 1
        if j >= n:
            return -1, 0, 0, 0.0
        if not (48 <= b[j] <= 57):
            return j, 0, 0, 0.0
        while j < n and 48 <= b[j] <= 57:
            if digits < 18:
                m = m * 10 + (b[j] - 48)
                frac += 1
            digits += 1
            j += 1
    exp = False
    if j < n and (b[j] == 101 or b[j] == 69):
        exp = True
        j += 1
        if j < n and (b[j] == 43 or b[j] == 45):
            j += 1
        if j >= n:
            return -1, 0, 0, 0.0
        if not (48 <= b[j] <= 57):
            return j, 0, 0, 0.0
        while j < n and 48 <= b[j] <= 57:
            j += 1
    if j >= n:
        return -1, 0, 0, 0.0
    if exp or digits > 18:
        return j, 3, 0, 0.0
    while frac > 0 and m % 10 == 0:  # 12.50 is 12.5, 7.0 is 7
        m //= 10
        frac -= 1
    v = -m if neg else m
    if frac == 0:
        if neg and m == 0:
            return j, 3, 0, 0.0  # -0: not an integer's digits
        return j, 1, v, float(v)
    if m > _MAX_EXACT:
        return j, 3, 0, 0.0
    return j, 2, 0, float(v) / _POW10[frac]


@njit(cache=True)
def _literal(b, i, n):
    """true / false / null at i -> (end, which: 0 null, 1 true, 2 false); end -1 short of the buffer, -2 invalid."""
    c = b[i]
    if c == 110 or c == 116:
        if i + 4 > n:
            return -1, 0
        if c == 110 and b[i + 1] == 117 and b[i + 2] == 108 and b[i + 3] == 108:
            return i + 4, 0
        if c == 116 and b[i + 1] == 114 and b[i + 2] == 117 and b[i + 3] == 101:
            return i + 4, 1
        return -2, 0
    if c == 102:
        if i + 5 > n:
            return -1, 0
        if b[i + 1] == 97 and b[i + 2] == 108 and b[i + 3] == 115 and b[i + 4] == 101:
            return i + 5, 2
        return -2, 0
    return -2, 0


@njit(cache=True)
def _member_key(b, i, n):
    """At a member's key (b[i] must be '"'): (start of the key text, its end, index after the ':' and
    whitespace); -1 when the buffer ends first, -2 invalid or not read here (escapes in the key)."""
    if b[i] != 34:
        return -2, 0, 0
    e, esc = _string_end(b, i, n)
    if e < 0:
        return e, 0, 0
    if esc:
        return -2, 0, 0
    j = _ws(b, e, n)
    if j >= n:
        return -1, 0, 0
    if b[j] != 58:
        return -2, 0, 0
    j = _ws(b, j + 1, n)
    if j >= n:
        return -1, 0, 0
    return i + 1, e - 1, j


@njit(cache=True)
def _skip_value(b, i, n, stack):
    """End of the JSON value at i, checked; -1 when the buffer ends first, -2 invalid / not read here."""
    depth = 0
    while True:
        i = _ws(b, i, n)
        if i >= n:
            return -1
        c = b[i]
        if c == 34:
            e, _ = _string_end(b, i, n)
            if e < 0:
                return e
            i = e
        elif c == 123 or c == 91:
            if depth >= stack.size:
                return -2
            stack[depth] = c
            depth += 1
            i = _ws(b, i + 1, n)
            if i >= n:
                return -1
            if b[i] == (125 if c == 123 else 93):
                depth -= 1
                i += 1
            elif c == 123:
                s, e, j = _member_key(b, i, n)
                if s < 0:
                    return s
                i = j
                continue
            else:
                continue
        elif c == 110 or c == 116 or c == 102:
            e, _ = _literal(b, i, n)
            if e < 0:
                return e
            i = e
        else:
            e, kind, _, _ = _number(b, i, n)
            if e < 0:
                return -1
            if kind == 0:
                return -2
            i = e
        while True:  # after a value: close containers, or the next member / element
            if depth == 0:
                return i
            i = _ws(b, i, n)
            if i >= n:
                return -1
            c = b[i]
            top = stack[depth - 1]
            if c == 44:
                i = _ws(b, i + 1, n)
                if i >= n:
                    return -1
                if top == 123:
                    s, e, j = _member_key(b, i, n)
                    if s < 0:
                        return s
                    i = j
                break
            if (c == 125 and top == 123) or (c == 93 and top == 91):
                depth -= 1
                i += 1
                continue
            return -2


@njit(cache=True)
def _top_key(b, s, e):
    L = e - s
    c0 = b[s] if L > 0 else 0
    if L == 2:
        if c0 == 112 and b[s + 1] == 104:
            return K_PH
        if c0 == 116 and b[s + 1] == 115:
            return K_TS
    elif L == 3:
        if c0 == 99 and b[s + 1] == 97 and b[s + 2] == 116:
            return K_CAT
        if c0 == 112 and b[s + 1] == 105 and b[s + 2] == 100:
            return K_PID
        if c0 == 116 and b[s + 1] == 105 and b[s + 2] == 100:
            return K_TID
        if c0 == 100 and b[s + 1] == 117 and b[s + 2] == 114:
            return K_DUR
    elif L == 4:
        if c0 == 110 and b[s + 1] == 97 and b[s + 2] == 109 and b[s + 3] == 101:
            return K_NAME
        if c0 == 97 and b[s + 1] == 114 and b[s + 2] == 103 and b[s + 3] == 115:
            return K_ARGS
    return -1


@njit(cache=True)
def _args_key(b, s, e):
    L = e - s
    for k in range(_AL.size):
        if _AL[k] == L:
            o = _AS[k]
            same = True
            for j in range(L):
                if b[s + j] != _AN[o + j]:
                    same = False
                    break
            if same:
                return k
    return -1


@njit(cache=True)
def _text(b, i, n, field, k, spans, stack):
    """A value read as text: a string without escapes, an integer's digits, or null -> spans[field]; the end
    of the value, -1 when the buffer ends first, -2 not read here."""
    c = b[i]
    if c == 34:
        e, esc = _string_end(b, i, n)
        if e < 0:
            return e
        if esc:
            return -2
        spans[field, 0, k] = i + 1
        spans[field, 1, k] = e - i - 2
        return e
    if c == 110:
        e, which = _literal(b, i, n)
        return e
    e, kind, _, _ = _number(b, i, n)
    if e == -1:
        return -1
    if kind != 1:
        return -2
    spans[field, 0, k] = i
    spans[field, 1, k] = e - i
    return e


@njit(cache=True)
def _float(b, i, n, slot, k, fl, fv, fspan):
    """ts / dur: a number (or null) -> fl[slot, k] with fv 1; fv 2: converted later from fspan."""
    if b[i] == 110:
        e, which = _literal(b, i, n)
        return e
    e, kind, _, v = _number(b, i, n)
    if e < 0:
        return e
    if kind == 1 or kind == 2:
        fl[slot, k] = v
        fv[slot, k] = 1
    elif kind == 3:
        fv[slot, k] = 2
        fspan[slot, 0, k] = i
        fspan[slot, 1, k] = e
    else:
        return -2
    return e


@njit(cache=True)
def _args(b, i, n, k, spans, it, iv, stack):
    """The args object at i -> the ints and stream it holds; its end, -1 / -2 as above."""
    if b[i] == 110:
        e, which = _literal(b, i, n)
        return e
    if b[i] != 123:
        return -2
    seen = 0
    j = _ws(b, i + 1, n)
    if j >= n:
        return -1
    if b[j] == 125:
        return j + 1
    while True:
        s, e, j = _member_key(b, j, n)
        if s < 0:
            return s
        a = _args_key(b, s, e)
        if a >= 0:
            if seen & (1 << a):
                return -2
            seen |= 1 << a
        if a == -1:
            ve = _skip_value(b, j, n, stack)
        elif a == A_STREAM:
            ve = _text(b, j, n, S_STREAM, k, spans, stack)
        else:
            slot = a if a < A_STREAM else a - 1
            if b[j] == 110:
                ve, which = _literal(b, j, n)
            else:
                ve, kind, x, _ = _number(b, j, n)
                if ve >= 0:
                    if kind == 1:
                        it[slot, k] = x
                        iv[slot, k] = 1
                    else:
                        ve = -2
        if ve < 0:
            return ve
        j = _ws(b, ve, n)
        if j >= n:
            return -1
        if b[j] == 44:
            j = _ws(b, j + 1, n)
            if j >= n:
                return -1
            continue
        if b[j] == 125:
            return j + 1
        return -2


@njit(cache=True, nogil=True)
def _scan(b, first, cap, ev, spans, fl, fv, fspan, it, iv, stack):
    """Whole events at the start of b -> (status, consumed, events, index after the array's ']' or -1)."""
    n = b.size
    pos = 0
    k = 0
    first_elem = first
    while k < cap:
        i = _ws(b, pos, n)
        if i >= n:
            return MORE, pos, k, -1
        c = b[i]
        if c == 93:
            return END, pos, k, i + 1
        if not first_elem:
            if c != 44:
                return FALLBACK, pos, k, -1
            i = _ws(b, i + 1, n)
            if i >= n:
                return MORE, pos, k, -1
            c = b[i]
        if c != 123:
            return FALLBACK, pos, k, -1
        ev[0, k] = i
        for f in range(6):
            spans[f, 1, k] = -1
        fv[0, k] = 0
        fv[1, k] = 0
        for f in range(5):
            iv[f, k] = 0
        seen = 0
        i = _ws(b, i + 1, n)
        if i >= n:
            return MORE, pos, k, -1
        if b[i] == 125:
            i += 1
        else:
            while True:
                s, e, j = _member_key(b, i, n)
                if s == -1:
                    return MORE, pos, k, -1
                if s < 0:
                    return FALLBACK, pos, k, -1
                key = _top_key(b, s, e)
                if key >= 0:
                    if seen & (1 << key):
                        return FALLBACK, pos, k, -1
                    seen |= 1 << key
                if key == -1:
                    e = _skip_value(b, j, n, stack)
                elif key <= K_NAME:
                    if b[j] == 34 or b[j] == 110:
                        e = _text(b, j, n, key, k, spans, stack)
                    else:
                        e = -2
                elif key <= K_TID:
                    e = _text(b, j, n, key, k, spans, stack)
                elif key <= K_DUR:
                    e = _float(b, j, n, key - K_TS, k, fl, fv, fspan)
                else:
                    e = _args(b, j, n, k, spans, it, iv, stack)
                if e == -1:
                    return MORE, pos, k, -1
                if e < 0:
                    return FALLBACK, pos, k, -1
                i = _ws(b, e, n)
                if i >= n:
                    return MORE, pos, k, -1
                if b[i] == 44:
                    i = _ws(b, i + 1, n)
                    if i >= n:
                        return MORE, pos, k, -1
                    continue
                if b[i] == 125:
                    i += 1
                    break
                return FALLBACK, pos, k, -1
        ev[1, k] = i
        pos = i
        k += 1
        first_elem = False
    return OK, pos, k, -1


@njit(cache=True, nogil=True)
def _gather(b, s, l, n):
    """Packed text of the spans (offsets, bytes): an Arrow string column's buffers."""
    off = np.zeros(n + 1, np.int64)
    for k in range(n):
        off[k + 1] = off[k] + (l[k] if l[k] > 0 else 0)
    data = np.empty(off[n], np.uint8)
    for k in range(n):
        L = l[k]
        if L > 0:
            o = off[k]
            st = s[k]
            for j in range(L):
                data[o + j] = b[st + j]
    return off, data


def _bitmap(valid: np.ndarray) -> tuple[pa.Buffer | None, int]:
    nulls = int(valid.size - np.count_nonzero(valid))
    return (pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None), nulls


def _texts(b: np.ndarray, s: np.ndarray, l: np.ndarray, n: int) -> pl.Series:
    off, data = _gather(b, s, l, n)
    bitmap, nulls = _bitmap(l[:n] >= 0)
    return pl.Series(pa.LargeStringArray.from_buffers(n, pa.py_buffer(off), pa.py_buffer(data), bitmap, nulls)).cast(pl.Utf8)


def _numbers(v: np.ndarray, valid: np.ndarray, n: int, typ) -> pl.Series:
    bitmap, nulls = _bitmap(valid[:n].view(bool))
    return pl.Series(pa.Array.from_buffers(typ, n, [bitmap, pa.py_buffer(np.ascontiguousarray(v[:n]).copy())], nulls))


class Spans:
    """Each scanned event's raw text by position (what fleetscope.ingest.traces._rare_args decodes)."""

    def __init__(self, text: bytes, ev: np.ndarray, n: int):
        self._text, self._s, self._e, self._n = text, ev[0, :n].copy(), ev[1, :n].copy(), n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> bytes:
        return self._text[self._s[i]:self._e[i]]


class Scanner:
    """Scans blocks of one file (keeps its arrays between blocks)."""

    def __init__(self, cap: int = 1 << 16):
        self._stack = np.zeros(64, np.uint8)
        self._alloc(cap)

    def _alloc(self, cap: int) -> None:
        self.cap = cap
        self._ev = np.zeros((2, cap), np.int64)
        self._spans = np.zeros((6, 2, cap), np.int64)
        self._fl = np.zeros((2, cap), np.float64)
        self._fv = np.zeros((2, cap), np.uint8)
        self._fspan = np.zeros((2, 2, cap), np.int64)
        self._it = np.zeros((5, cap), np.int64)
        self._iv = np.zeros((5, cap), np.uint8)

    def scan(self, text: bytes, first: bool):
        """-> (status, consumed, frame of the events or None, their Spans, index after the array's ']' or -1).
        The frame has the columns and types of fleetscope.ingest.traces' NDJSON read (args a struct)."""
        b = np.frombuffer(text, np.uint8)
        need = len(text) // 32 + 16
        if need > self.cap:
            self._alloc(need)
        st, consumed, k, end = _scan(b, first, self.cap, self._ev, self._spans, self._fl, self._fv, self._fspan, self._it,
                                     self._iv, self._stack)
        if k == 0:
            return st, consumed, None, None, end
        return st, consumed, self._frame(text, b, k), Spans(text, self._ev, k), end

    def _frame(self, text: bytes, b: np.ndarray, k: int) -> pl.DataFrame:
        sp, fl = self._spans, self._fl
        for slot in (0, 1):  # numbers the fast path does not convert exactly: Python's float()
            later = np.flatnonzero(self._fv[slot, :k] == 2)
            for j in later.tolist():
                fl[slot, j] = float(text[self._fspan[slot, 0, j]:self._fspan[slot, 1, j]])
            self._fv[slot, later] = 1
        cols = {c: _texts(b, sp[f, 0], sp[f, 1], k) for f, c in enumerate(("ph", "cat", "name", "pid", "tid"))}
        cols["ts"] = _numbers(fl[0], self._fv[0], k, pa.float64())
        cols["dur"] = _numbers(fl[1], self._fv[1], k, pa.float64())
        ints = {name: _numbers(self._it[slot], self._iv[slot], k, pa.int64())
                for slot, name in enumerate(("External id", "correlation", "device", "Sequence number", "Fwd thread id"))}
        args = pl.struct(**{"External id": ints["External id"], "correlation": ints["correlation"], "device": ints["device"],
                            "stream": _texts(b, sp[S_STREAM, 0], sp[S_STREAM, 1], k),
                            "Sequence number": ints["Sequence number"], "Fwd thread id": ints["Fwd thread id"]})
        return pl.DataFrame(cols).with_columns(args=args)
