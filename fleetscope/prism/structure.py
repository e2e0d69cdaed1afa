"""A job's per-step execution structure, read from its timings, and an exact vectorized replay.

From the op rows of one capture we recover, per rank, the ordered sequence of operation *slots*
of a training step (ops recorded with identical start and end on a rank, like Megatron's fused
`send_forward_recv_backward`, form one slot), and which slots of different ranks synchronize
(point-to-point pairs of the pipeline, DP / TP / embedding / model-parallel collectives). Each
step's slots then carry two measured numbers:

- ``gap``: time the rank spent before the slot that no recorded op explains (launch delay,
  data loading), start minus the end of the rank's previous slot (or the step start);
- ``dur``: the slot's intrinsic duration; for compute, end - start; for a synchronizing slot,
  end - (latest start among its group), i.e. the transfer without the time spent waiting for
  slower peers (the StragglerAnalysis "transfer duration").

`replay_job_graph` runs the max-plus recurrence of that structure over any number of sampled
(gap, dur) columns at once; with the measured columns it reproduces the measured step times,
which is what makes forecasts and what-ifs built on it trustworthy."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl

# Megatron pipeline p2p op names: (direction, offset from this stage to the link's lower stage)
_P2P = {
    "forward-send": ("forward", 0),    # s -> s+1 : link s
    "forward-recv": ("forward", -1),   # s-1 -> s : link s-1
    "backward-send": ("backward", -1), # s -> s-1 : link s-1
    "backward-recv": ("backward", 0),  # s+1 -> s : link s
}


def collective_scope(name: str) -> str | None:
    """Which ranks synchronize in a named operation: 'dp' (same stage and TP index), 'tp' (same
    DP replica and stage), 'embedding' (first and last stage of a DP replica), 'world', or
    None for local work. Megatron timer names and the contract's nccl kernel names."""
    n = name.lower()
    if n in _P2P:
        return "p2p"
    if n in ("grads-reduce-scatter", "params-all-gather", "separate-grads-all-reduce", "all-grads-sync", "grads-all-reduce"):
        return "dp"
    if n.startswith("tp-") or n in ("layernorm-grads-all-reduce",):
        return "tp"
    if n == "embedding-grads-all-reduce":
        return "embedding"
    if n == "optimizer-clip-main-grad":  # grad-norm all-reduce over every rank (distributed optimizer)
        return "world"
    if n.startswith("nccl:") and not n.startswith(("nccl:send", "nccl:recv")):
        return "group"
    return None


def is_comm_name(name: str) -> bool:
    """A slot name (fused ops joined by '+') that communicates: a collective or p2p op."""
    return any(collective_scope(n) is not None for n in name.split("+"))


@dataclass
class JobGraph:
    capture_id: str
    kind: str                      # which timing rows ('op' or 'kernel') the structure was built from
    ranks: np.ndarray              # rank id per rank index
    stage: np.ndarray              # per rank index (-1 unknown)
    dp_rank: np.ndarray
    tp_rank: np.ndarray
    slots: pl.DataFrame            # slot, rank_idx, rank, pos, occ, name, names, microbatch, group, is_comm, concurrent, stage, dp_rank, tp_rank
    slot_rank: np.ndarray          # rank index per slot
    group_of: np.ndarray           # group id per slot (slots linked by any synchronization)
    group_members: list[np.ndarray]
    group_is_comm: np.ndarray
    order: list[int]               # slots in a topological order of the step's dependencies
    steps: np.ndarray              # steps kept (same structure on every rank)
    gap: np.ndarray                # [n_slots, n_steps] ns, float64
    dur: np.ndarray                # [n_slots, n_steps] ns, float64
    measured_step_ns: np.ndarray   # [n_steps]
    waits: list[np.ndarray]        # per slot: the slots whose arrival it waits for
    next_slot: np.ndarray          # per slot: the rank's next slot (-1 at the end)
    first_slot: np.ndarray         # per rank: its first slot
    layout: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # steps left out, unmatched peers, clipped waits
    _plan: dict | None = field(default=None, repr=False, compare=False)  # replay_plan, computed once
    first_local_gap: np.ndarray | None = None  # [n_ranks, n_steps] ns: first op's start - the rank's previous step's end (NaN: not captured)
    step_start_ns: np.ndarray | None = None    # [n_steps] absolute start of each kept step (its first op)

    @property
    def concurrent(self) -> np.ndarray:
        return self.slots["concurrent"].to_numpy()

    @property
    def n_slots(self) -> int:
        return len(self.slot_rank)

    @property
    def n_ranks(self) -> int:
        return len(self.ranks)

    def slot_names(self) -> np.ndarray:
        return self.slots["name"].to_numpy()


CONCURRENT_MIN_NS = 100_000  # overlaps shorter than this are timer jitter, not concurrency
NEGATIVE_NOTE_NS = 10_000    # intrinsic times below -this are worth a note (smaller: timer jitter)
ASYNC_SEND_MAX_NS = 1_000     # a send recorded this short was issued without waiting for its receiver


class StructureError(ValueError):
    pass


def _pick_kind(t: pl.DataFrame) -> str:
    kinds = set(t["kind"].unique().to_list())
    for k in ("op", "kernel"):
        if k in kinds:
            return k
    raise StructureError(f"timings hold no 'op' or 'kernel' rows (kinds: {sorted(kinds)}); a step structure needs one of them")


def build_job_graph(timings: pl.DataFrame, capture_id: str | None = None, layout: dict | None = None) -> JobGraph:
    """Timings of ONE capture -> its JobGraph. Raises StructureError with a reason a person can act
    on when the rows cannot give a step structure (no step numbers, a rank missing, ...)."""
    if timings.height == 0:
        raise StructureError("no timing rows")
    if capture_id is None:
        caps = timings["capture_id"].unique().to_list() if "capture_id" in timings.columns else ["capture"]
        if len(caps) != 1:
            raise StructureError(f"build_job_graph takes one capture; got {len(caps)}: {caps[:5]}")
        capture_id = str(caps[0])
    kind = _pick_kind(timings)
    t = timings.filter(pl.col("kind") == kind)
    if t["step"].null_count() == t.height:
        raise StructureError(f"capture {capture_id}: {kind} rows carry no step numbers; step times cannot be measured")
    notes: list[str] = []
    n_nostep = t["step"].null_count()
    if n_nostep:
        notes.append(f"{n_nostep} {kind} rows without a step number left out")
    t = t.filter(pl.col("step").is_not_null())
    for c in ("stage", "dp_rank", "tp_rank", "microbatch", "group"):
        if c not in t.columns:
            t = t.with_columns(pl.lit(None).alias(c))

    # fused slots: rows of one rank with identical start and end are one operation
    slots_all = (
        t.group_by("rank", "step", "start_ns", "end_ns")
        .agg(pl.col("name").sort().alias("names"), pl.col("microbatch").min(), pl.col("group").first(),
             pl.col("stage").first(), pl.col("dp_rank").first(), pl.col("tp_rank").first())
        .with_columns(name=pl.col("names").list.join("+"))
        .sort("rank", "step", "start_ns", "end_ns", "name")
        .with_columns(pos=pl.int_range(pl.len()).over("rank", "step"))
    )
    # one structure per rank: the most common op sequence. Steps whose ops on some rank differ
    # (not only in order: ties such as a zero-length gc next to a send swap places) are left out.
    slots_all = slots_all.with_columns(occ=pl.int_range(pl.len()).over("rank", "step", "name"))
    sig = slots_all.group_by("rank", "step").agg(pl.col("name").str.join("|").alias("sig"),
                                                 pl.col("name").sort().str.join("|").alias("bag"))
    modal = sig.group_by("rank", "sig", "bag").len().sort("len", "sig", descending=[True, False]).group_by("rank", maintain_order=True).first()
    sig = sig.join(modal.select("rank", pl.col("sig").alias("modal"), pl.col("bag").alias("modal_bag")), on="rank")
    ranks = np.sort(sig["rank"].unique().to_numpy())
    per_step = sig.group_by("step").agg((pl.col("bag") == pl.col("modal_bag")).all().alias("ok"),
                                        (pl.col("sig") == pl.col("modal")).all().alias("same_order"), pl.len().alias("n"))
    okx = pl.col("ok") & (pl.col("n") == len(ranks))
    good = per_step.filter(okx)["step"].sort().to_numpy()
    bad = per_step.filter(~okx)["step"].sort().to_list()
    if bad:
        notes.append(f"steps {bad[:20]}{'...' if len(bad) > 20 else ''} left out: their ops differ from the other steps or a rank is missing")
    if len(good) == 0:
        raise StructureError(f"capture {capture_id}: no step has the same ops on every rank; cannot build a step structure")
    ref_step = per_step.filter(okx & pl.col("same_order"))["step"].sort()
    if ref_step.len() == 0:
        raise StructureError(f"capture {capture_id}: no step has every rank in its usual op order")

    ref = slots_all.filter(pl.col("step") == int(ref_step[0])).sort("rank", "pos")
    rank_index = {int(r): i for i, r in enumerate(ranks)}
    first = ref.group_by("rank").agg(pl.col("stage", "dp_rank", "tp_rank").drop_nulls().first()).sort("rank")
    stage = first["stage"].fill_null(-1).to_numpy().astype(np.int64)
    dp = first["dp_rank"].fill_null(-1).to_numpy().astype(np.int64)
    tp = first["tp_rank"].fill_null(0).to_numpy().astype(np.int64)
    if (stage < 0).all():
        stage[:] = 0
    if (dp < 0).all():
        dp[:] = np.arange(len(ranks)) if (stage == 0).all() else 0

    n_slots = ref.height
    slot_rank = np.array([rank_index[int(r)] for r in ref["rank"].to_list()], dtype=np.int64)
    # union-find over slots that share a synchronization key
    parent = list(range(n_slots))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    n_stages = int(stage.max()) + 1
    keys: dict[tuple, list[int]] = defaultdict(list)
    occ: dict[tuple, int] = defaultdict(int)
    for i, (rk, names, grp) in enumerate(zip(ref["rank"].to_list(), ref["names"].to_list(), ref["group"].to_list())):
        ri = rank_index[int(rk)]
        for nm in names:
            k = occ[(ri, nm)]
            occ[(ri, nm)] += 1
            scope = collective_scope(nm)
            if scope is None:
                continue
            s, d, p = int(stage[ri]), int(dp[ri]), int(tp[ri])
            if scope == "p2p":
                direction, off = _P2P[nm.lower()]
                key = ("p2p", direction, d, p, (s + off) % n_stages, k)  # modulo: interleaved chunks wrap from the last stage to the first
            elif scope == "dp":
                key = ("dp", nm, s, p, k)
            elif scope == "tp":
                key = ("tp", nm, d, s, k)
            elif scope == "embedding":
                key = ("emb", nm, d, p, k)
            elif scope == "group" and grp is not None:
                key = ("grp", nm, grp, k)
            else:  # world, or a collective without a group id: everyone who runs it
                key = ("world", nm, k)
            keys[key].append((i, "send" if "send" in nm.lower() else "recv" if "recv" in nm.lower() else "coll"))
    ref_dur = (ref["end_ns"] - ref["start_ns"]).to_numpy()
    unmatched = 0
    # who waits for whom: collective members and blocking (rendezvous) send/recv pairs wait for
    # each other's arrival; a non-blocking send (recorded with ~0 duration: an async isend) does
    # not wait, only its receiver waits for it
    waits_set: list[set] = [set() for _ in range(n_slots)]
    for key, members in keys.items():
        idx = [i for i, _ in members]
        if key[0] == "p2p" and len(members) < 2:
            unmatched += 1
        for m in idx[1:]:
            parent[find(m)] = find(idx[0])
        senders = [i for i, role in members if role == "send"]
        directed = key[0] == "p2p" and any(ref_dur[i] <= ASYNC_SEND_MAX_NS and len(ref["names"][i]) == 1 for i in senders)
        for i, role in members:
            peers = senders if (directed and role == "recv") else ([] if directed else idx)
            waits_set[i].update(j for j in peers if j != i)
    if unmatched:
        notes.append(f"{unmatched} pipeline send/recv ops without a peer on the neighbouring stage: treated as local ops")
    waits = [np.array(sorted(w), dtype=np.int64) for w in waits_set]
    roots = np.array([find(i) for i in range(n_slots)])
    _, group_of = np.unique(roots, return_inverse=True)
    n_groups = int(group_of.max()) + 1
    members_list = [[] for _ in range(n_groups)]
    for i, g in enumerate(group_of):
        members_list[g].append(i)
    group_members = [np.array(m, dtype=np.int64) for m in members_list]
    group_is_comm = np.array([len(m) > 1 for m in members_list])

    # topological order of slots: a rank's next slot runs once the slots it waits for have
    # arrived (are at the head of their rank or done)
    pos_arr = ref["pos"].to_numpy()
    seq = [[] for _ in ranks]
    for i in np.lexsort((pos_arr, slot_rank)):
        seq[slot_rank[i]].append(int(i))
    rank_pos = np.zeros(n_slots, dtype=np.int64)
    for r in range(len(ranks)):
        for k, i in enumerate(seq[r]):
            rank_pos[i] = k
    head = np.zeros(len(ranks), dtype=np.int64)
    order: list[int] = []
    progress = True
    while progress:
        progress = False
        for r in range(len(ranks)):
            while head[r] < len(seq[r]):
                i = seq[r][head[r]]
                w = waits[i]
                if len(w) and (rank_pos[w] > head[slot_rank[w]]).any():
                    break
                order.append(i)
                head[r] += 1
                progress = True
    if len(order) != n_slots:
        stuck = [(int(ref["rank"][seq[r][head[r]]]), ref["name"][seq[r][head[r]]], int(ref["occ"][seq[r][head[r]]]))
                 for r in range(len(ranks)) if head[r] < len(seq[r])][:6]
        raise StructureError(f"capture {capture_id}: the synchronizing ops wait on each other in a cycle (stuck at {stuck}); "
                             "check the stage / dp_rank columns and the op order")
    next_slot = np.full(n_slots, -1, dtype=np.int64)
    first_slot = np.array([seq[r][0] for r in range(len(ranks))], dtype=np.int64)
    for r in range(len(ranks)):
        for a, b in zip(seq[r][:-1], seq[r][1:]):
            next_slot[a] = b

    # a slot that starts before the rank's earlier ops have ended runs beside them (another
    # stream, e.g. a gradient all-reduce overlapping the last backward): it is anchored to the
    # previous slot's start instead of the rank's latest end
    # Only collectives are launched beside other work (gradient buckets during the backward);
    # a compute or p2p op that starts before the rank's earlier ops end is waiting for them
    # inside its timer (e.g. an optimizer step blocked on the gradient all-reduce).
    overlap = pl.col("end_ns").cum_max().shift(1).over("rank") - pl.col("start_ns")
    is_coll = pl.col("names").list.eval(pl.element().map_elements(lambda n: collective_scope(n) not in (None, "p2p"), return_dtype=pl.Boolean)).list.any()
    ref = ref.with_columns(concurrent=(is_coll & (overlap > CONCURRENT_MIN_NS)).fill_null(False))
    # A sequential op that ends after a concurrent collective it overlaps waited for it (an
    # optimizer blocked on the gradient all-reduce: after_all); one that ends before it ran
    # beside it on the compute stream (a send after the last backward) and follows only the
    # rank's sequential ops.
    ref = ref.with_columns(pe_all=pl.col("end_ns").cum_max().shift(1).over("rank"))
    ref = ref.with_columns(after_all=(~pl.col("concurrent") & (pl.col("end_ns") >= pl.col("pe_all") - CONCURRENT_MIN_NS)).fill_null(True)
                           | pl.col("concurrent"))
    slots = ref.select(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("slot"),
        pl.Series("rank_idx", slot_rank), pl.col("rank"), "pos", "occ", "name", "names", "microbatch",
        pl.Series("group", group_of.astype(np.int64)),
        pl.Series("is_comm", group_is_comm[group_of]), "concurrent", "after_all",
        pl.Series("stage", stage[slot_rank]), pl.Series("dp_rank", dp[slot_rank]), pl.Series("tp_rank", tp[slot_rank]),
    )

    # measured gap and intrinsic duration per slot and kept step
    kept = slots_all.filter(pl.col("step").is_in(good.tolist()))
    step_start = kept.group_by("step").agg(pl.col("start_ns").min().alias("t0"))
    kept = (kept.join(step_start, on="step")
            .sort("rank", "step", "pos")
            .join(slots.select("rank", "name", "occ", "slot", "concurrent", "after_all", pl.col("group").alias("gid")), on=["rank", "name", "occ"])
            .with_columns(pe_all=pl.col("end_ns").cum_max().shift(1).over("rank", "step"),
                          pe_seq=pl.when(pl.col("concurrent")).then(None).otherwise(pl.col("end_ns"))
                          .cum_max().shift(1).forward_fill().over("rank", "step"),
                          prev_start=pl.col("start_ns").shift(1).over("rank", "step"))
            .with_columns(prev_end=pl.coalesce(pl.when(pl.col("after_all")).then(pl.col("pe_all")).otherwise(pl.col("pe_seq")), "t0"))
            .with_columns(gap=pl.when(pl.col("concurrent")).then(pl.col("start_ns") - pl.col("prev_start"))
                          .otherwise(pl.col("start_ns") - pl.col("prev_end")).cast(pl.Float64)))
    step_idx = {int(s): j for j, s in enumerate(good)}
    kept = kept.with_columns(j=pl.col("step").replace_strict(step_idx, return_dtype=pl.Int64))
    si, sj = kept["slot"].to_numpy(), kept["j"].to_numpy()
    ST = np.zeros((n_slots, len(good)))
    ST[si, sj] = kept["start_ns"].to_numpy()
    PE = np.zeros((n_slots, len(good)))
    PE[si, sj] = kept["prev_end"].to_numpy()
    conc = slots["concurrent"].to_numpy()
    # latest start among a slot and those it waits for (and, for a sequential slot, the end of
    # the rank's earlier work): the intrinsic duration runs from there
    latest = np.where(conc[:, None], ST, np.maximum(ST, PE))
    for i in range(n_slots):
        if len(waits[i]):
            latest[i] = np.maximum(latest[i], ST[waits[i]].max(axis=0))
    kept = kept.with_columns(dur=(pl.col("end_ns") - pl.Series(latest[si, sj])).cast(pl.Float64))
    n_neg = kept.filter(pl.col("dur") < -NEGATIVE_NOTE_NS).height
    if n_neg:
        notes.append(f"{n_neg} op records ended before the ops they depend on started or ended (eager sends, timer skew): "
                     "their intrinsic time is taken as 0")
    gap = np.zeros((n_slots, len(good)))
    dur = np.zeros((n_slots, len(good)))
    gap[si, sj] = np.maximum(kept["gap"].to_numpy(), 0.0)
    dur[si, sj] = np.maximum(kept["dur"].to_numpy(), 0.0)
    meas = (kept.group_by("step").agg((pl.col("end_ns").max() - pl.col("t0").first()).alias("T")).sort("step"))
    measured = meas["T"].to_numpy().astype(np.float64)
    # a rank's first op depends on its own previous step (its last op): the launch delay measured
    # from there, where the previous step was captured (NaN elsewhere). What lies between the step's
    # start (the first rank's first op) and that is the previous step's tail on this rank (e.g.
    # the order in which ranks leave the last collective), not a delay of this step.
    rank_end = slots_all.group_by("rank", "step").agg(pl.col("end_ns").max().alias("prev_end")).with_columns(pl.col("step") + 1)
    firsts = (kept.filter(pl.col("pos") == 0).select("rank", "step", "j", "start_ns")
              .join(rank_end, on=["rank", "step"], how="left")
              .with_columns(local=(pl.col("start_ns") - pl.col("prev_end")).cast(pl.Float64)))
    first_local = np.full((len(ranks), len(good)), np.nan)
    ok = firsts.filter(pl.col("local").is_not_null())
    first_local[[rank_index[int(r)] for r in ok["rank"].to_list()], ok["j"].to_numpy()] = np.maximum(ok["local"].to_numpy(), 0.0)
    t0s = step_start.sort("step").filter(pl.col("step").is_in(good.tolist()))["t0"].to_numpy()

    lay = {k: v for k, v in (layout or {}).items() if v is not None}  # a capture's known layout; gaps filled from the data
    lay.setdefault("pp", int(stage.max()) + 1)
    lay.setdefault("dp", int(dp.max()) + 1)
    lay.setdefault("tp", int(tp.max()) + 1)
    names = ref["name"].to_list()
    per_rank_fwd = [sum(1 for i in seq[r] if names[i] == "forward-compute") for r in range(len(ranks))]
    vpp = lay.get("vpp") or 1
    if max(per_rank_fwd, default=0):
        lay.setdefault("microbatches", int(max(per_rank_fwd) // max(vpp, 1)))
        lay.setdefault("schedule", _detect_schedule([names[i] for i in seq[int(np.argmax(stage))]], vpp))
    return JobGraph(capture_id, kind, ranks, stage, dp, tp, slots, slot_rank, group_of, group_members,
                    group_is_comm, order, good, gap, dur, measured, waits, next_slot, first_slot, lay, notes,
                    first_local_gap=first_local, step_start_ns=t0s)


def _detect_schedule(names_last_stage: list[str], vpp: int) -> str:
    """On the last stage GPipe runs every forward before any backward; 1F1B alternates."""
    comp = [n for n in names_last_stage if n in ("forward-compute", "backward-compute")]
    if not comp:
        return "unknown"
    first_b = comp.index("backward-compute") if "backward-compute" in comp else len(comp)
    if first_b > 1 and all(n == "backward-compute" for n in comp[first_b:]):
        return "gpipe"
    return "interleaved_1f1b" if vpp > 1 else "1f1b"


def replay_plan(g: JobGraph) -> list[dict]:
    """The replay's schedule, computed once per graph: slots in *levels*. A slot's arrival needs its
    rank's previous slot done; its start needs the arrivals of the slots it waits for, which are
    in its synchronization group. A group's level is one more than the highest level among its
    members' previous slots, so every slot of a level can be computed at once (numpy over all
    of them): a 128-rank pipeline has ~50 levels for ~3,000 slots. Each level holds the slots,
    their previous slots by how the arrival is anchored (after the rank's latest end, after its
    sequential ops only, or at the previous slot's start for a concurrent one), and the wait sets
    (the slot and those it waits for) to take the latest arrival over."""
    if getattr(g, "_plan", None) is not None:
        return g._plan
    n = g.n_slots
    prev = np.full(n, -1, dtype=np.int64)
    has = g.next_slot >= 0
    prev[g.next_slot[has]] = np.flatnonzero(has)
    # level(i) >= level(previous slot) + 1 (its arrival needs the previous slot's end) and
    # >= level(w) for every slot w it waits for (their arrivals are computed first within a
    # level); relaxed over the topological order until nothing moves (symmetric waits: equal levels)
    level = np.zeros(n, dtype=np.int64)
    waits = [w.tolist() for w in g.waits]
    prev_l = prev.tolist()
    lv_list = level.tolist()
    for _ in range(n + 1):
        moved = False
        for i in g.order:
            v = lv_list[prev_l[i]] + 1 if prev_l[i] >= 0 else 0
            for w in waits[i]:
                if lv_list[w] > v:
                    v = lv_list[w]
            if v != lv_list[i]:
                lv_list[i] = v
                moved = True
        if not moved:
            break
    else:
        raise StructureError(f"capture {g.capture_id}: the synchronizing ops wait on each other in a cycle")
    level = np.array(lv_list, dtype=np.int64)
    conc = g.concurrent
    after_all = g.slots["after_all"].to_numpy()
    # how a slot's arrival is anchored: 0 first slot of its rank (the step start), 1 at the previous
    # slot's start (a concurrent slot), 2 after the rank's latest end, 3 after its sequential ops
    mode = np.where(prev < 0, 0, np.where(conc, 1, np.where(after_all, 2, 3)))
    # slots laid out level by level (and by mode within a level): every level is a contiguous
    # block of rows, so the replay reads and writes slices instead of scattered rows
    perm = np.lexsort((np.arange(n), mode, level))
    inv = np.empty(n, dtype=np.int64)
    inv[perm] = np.arange(n)
    wait_sets: dict[tuple, int] = {}
    set_of = np.empty(n, dtype=np.int64)
    set_members: list[np.ndarray] = []
    for i in range(n):
        key = tuple(sorted({int(inv[i]), *inv[g.waits[i]].tolist()}))
        k = wait_sets.get(key)
        if k is None:
            k = wait_sets[key] = len(set_members)
            set_members.append(np.array(key, dtype=np.int64))
        set_of[inv[i]] = k
    lev_p, mode_p, prev_p = level[perm], mode[perm], np.where(prev[perm] >= 0, inv[np.maximum(prev[perm], 0)], -1)
    bounds = np.searchsorted(lev_p, np.arange(int(level.max()) + 2))
    levels = []
    for lv in range(int(level.max()) + 1):
        lo, hi = int(bounds[lv]), int(bounds[lv + 1])
        parts = []
        for m in range(4):
            a, b = lo + int(np.searchsorted(mode_p[lo:hi], m)), lo + int(np.searchsorted(mode_p[lo:hi], m, side="right"))
            if b > a:
                parts.append((m, a, b, prev_p[a:b]))
        # slots that wait for others: their start is the latest arrival over their wait set
        multi = np.array([len(set_members[set_of[i]]) > 1 for i in range(lo, hi)], dtype=bool)
        sets = np.unique(set_of[lo:hi][multi])
        flat = np.concatenate([set_members[k] for k in sets]) if len(sets) else np.zeros(0, dtype=np.int64)
        offs = np.cumsum([0] + [len(set_members[k]) for k in sets[:-1]]) if len(sets) else np.zeros(0, dtype=np.int64)
        levels.append({"lo": lo, "hi": hi, "parts": parts, "prev": np.maximum(prev_p[lo:hi], 0),
                       "first": prev_p[lo:hi] < 0, "seq": ~conc[perm[lo:hi]], "multi": lo + np.flatnonzero(multi),
                       "flat": flat, "offs": offs, "pos": np.searchsorted(sets, set_of[lo:hi][multi])})
    last = g.next_slot < 0
    plan = {"perm": perm, "levels": levels, "last": inv[last], "last_rank": g.slot_rank[last],
            "any_conc": bool(conc.any())}
    g._plan = plan
    return plan


def replay_job_graph(g: JobGraph, gap: np.ndarray, dur: np.ndarray, per_rank: bool = False,
                     timeline: bool = False):
    """Max-plus recurrence of the step over S columns at once: gap, dur are [n_slots, S]
    (ns; a [n_slots, 1] column broadcasts). A slot arrives gap after its rank's latest end (of
    every earlier op, or of the sequential ones only for an op that runs beside a concurrent
    collective; after the previous slot's start for a concurrent slot), starts when it and every
    slot it waits for have arrived, and ends dur later. Returns the step time per column (latest
    end over ranks), [n_ranks, S] end times with per_rank=True, or with timeline=True the
    [n_slots, S] (arrive, start, end) arrays: arrive is when the rank reaches the op (what a
    tracer records as its start), start when its peers have arrived too. Computed level by level
    (replay_plan): all slots of a level in one numpy operation."""
    S = max(gap.shape[1], dur.shape[1])
    n = g.n_slots
    plan = replay_plan(g)
    perm = plan["perm"]
    dtype = np.result_type(gap.dtype, dur.dtype, np.float32)
    gap = np.broadcast_to(gap[perm], (n, S))    # rows in the plan's level order
    dur = np.broadcast_to(dur[perm], (n, S))
    arrive = np.empty((n, S), dtype)
    start = np.empty((n, S), dtype)
    ready = np.empty((n, S), dtype)      # latest end of the rank's slots up to this one
    any_conc = plan["any_conc"]
    # the same over its sequential (non-concurrent) slots; without concurrent slots it is `ready`
    ready_seq = np.empty((n, S), dtype) if any_conc else ready
    for lv in plan["levels"]:
        lo, hi = lv["lo"], lv["hi"]
        for m, a, b, p in lv["parts"]:
            if m == 0:
                arrive[a:b] = gap[a:b]
            else:
                np.add((start, ready, ready_seq)[m - 1][p], gap[a:b], out=arrive[a:b])
        start[lo:hi] = arrive[lo:hi]
        if len(lv["multi"]):
            start[lv["multi"]] = np.maximum.reduceat(arrive[lv["flat"]], lv["offs"], axis=0)[lv["pos"]]
        end = start[lo:hi] + dur[lo:hi]
        p = lv["prev"]
        rs = ready_seq[p] if any_conc else None   # read before `ready` is written (they may be one array)
        if lv["first"].any():
            ready[lo:hi] = np.where(lv["first"][:, None], end, np.maximum(ready[p], end))
            if any_conc:
                rs = np.where(lv["first"][:, None], -np.inf, rs)
        else:
            ready[lo:hi] = np.maximum(ready[p], end)
        if any_conc:
            ready_seq[lo:hi] = np.where(lv["seq"][:, None], np.maximum(rs, end), rs)
    if timeline:
        inv = np.argsort(perm)
        return arrive[inv], start[inv], (start + dur)[inv]
    if not per_rank:
        return ready[plan["last"]].max(axis=0)
    per = np.full((g.n_ranks, S), -np.inf, dtype)
    per[plan["last_rank"]] = ready[plan["last"]]      # one last slot per rank
    return per

def subset_steps(g: JobGraph, keep: np.ndarray) -> JobGraph:
    """The same structure over a subset of its measured steps (`keep`: bool per step or step
    indices), e.g. to fit a model on the first half of a capture and score it on the second."""
    keep = np.asarray(keep)
    if keep.dtype == bool:
        keep = np.flatnonzero(keep)
    if len(keep) == 0:
        raise StructureError(f"capture {g.capture_id}: no steps left in the subset")
    return replace(g, steps=g.steps[keep], gap=g.gap[:, keep], dur=g.dur[:, keep],
                   measured_step_ns=g.measured_step_ns[keep], notes=list(g.notes),
                   first_local_gap=None if g.first_local_gap is None else g.first_local_gap[:, keep],
                   step_start_ns=None if g.step_start_ns is None else g.step_start_ns[keep])
