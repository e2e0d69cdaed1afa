"""The XPUTimer metrics over profiler traces: trace_events (fleetscope.ingest.traces) -> the same
timings frame the tracer writes, where the traces carry the same facts:

- GPU kernels: start/end on the device, issue = the launching CUDA runtime call (same correlation
  id), stream; communication kernels become `nccl:<Collective>` with bytes, group (pg_name) and
  group size; GEMM-like kernels become `gemm` (FLOPs are unknown: traces carry no GEMM shapes);
- CPU-only traces: communication operators with a message size (record_param_comms) as kernels
  timed on the CPU;
- API events: the DataLoader `__next__` and `Optimizer.step` operators, device synchronizations;
- step: the enclosing `ProfilerStep#N` annotation.
"""
from __future__ import annotations

import polars as pl

_CAMEL = {"allreduce": "AllReduce", "allgather": "AllGather", "reduce_scatter": "ReduceScatter", "broadcast": "Broadcast",
          "send": "Send", "recv": "Recv", "all_to_all": "AllToAll", "reduce": "Reduce", "barrier": "Barrier"}
_GEMM = r"(?i)gemm|cutlass|xmma|cublas|matmul|s\d+_tensorop|ampere_.*(?:nn|nt|tn|tt)"


def timings_from_trace_events(ev: pl.DataFrame) -> pl.DataFrame:
    if ev.height == 0:
        raise ValueError("no trace events")
    key = ["capture_id", "rank"]
    coll = pl.col("collective")
    camel = coll.replace_strict(_CAMEL, default=None)
    comm_name = pl.concat_str([pl.lit("nccl:"), pl.coalesce(camel, coll)])
    launch = ev.filter((pl.col("cat") == "cuda_runtime") & pl.col("correlation").is_not_null()).select(
        *key, "correlation", pl.col("ts_ns").alias("issue_ns"))
    gpu = ev.filter(pl.col("cat") == "kernel").join(launch, on=[*key, "correlation"], how="left")
    gpu = gpu.select(
        *key, pl.lit("kernel").alias("kind"),
        pl.when(pl.col("is_comm")).then(comm_name).when(pl.col("name").str.contains(_GEMM)).then(pl.lit("gemm"))
        .otherwise(pl.col("name")).alias("name"),
        pl.coalesce("issue_ns", "ts_ns").alias("issue_ns"), pl.col("ts_ns").alias("start_ns"), "end_ns", "stream",
        pl.when(pl.col("is_comm")).then(pl.col("msg_bytes")).alias("bytes"),
        pl.when(pl.col("is_comm")).then(pl.coalesce(pl.col("pg_name"), pl.lit("pg"))).alias("group"),
        pl.when(pl.col("is_comm")).then(pl.col("group_size")).alias("group_size"))
    has_gpu = gpu.height > 0
    parts = [gpu]
    if not has_gpu:  # CPU-only trace: the communication operators that know their size
        cpu = ev.filter((pl.col("cat") == "cpu_op") & pl.col("is_comm") & pl.col("msg_bytes").is_not_null())
        parts.append(cpu.select(*key, pl.lit("kernel").alias("kind"), comm_name.alias("name"), pl.col("ts_ns").alias("issue_ns"),
                                pl.col("ts_ns").alias("start_ns"), "end_ns", pl.lit(None, pl.Int64).alias("stream"),
                                pl.col("msg_bytes").alias("bytes"), pl.coalesce(pl.col("pg_name"), pl.lit("pg")).alias("group"),
                                "group_size"))
    n = pl.col("name")
    api_name = (pl.when(n.str.contains(r"DataLoader.*__next__|DataLoaderIter\.__next__")).then(pl.lit("dataloader.next"))
                .when(n.str.contains(r"^Optimizer\.step#")).then(pl.lit("optimizer.step"))
                .when(n.str.contains(r"^cuda(Device|Stream)Synchronize$")).then(pl.lit("cuda.synchronize")))
    api = ev.filter(pl.col("cat").is_in(["cpu_op", "user_annotation", "cuda_runtime"])).with_columns(api_name.alias("_api"))
    api = api.filter(pl.col("_api").is_not_null()).select(
        *key, pl.lit("api").alias("kind"), pl.col("_api").alias("name"), pl.col("ts_ns").alias("issue_ns"),
        pl.col("ts_ns").alias("start_ns"), "end_ns", pl.lit(None, pl.Int64).alias("stream"), pl.lit(None, pl.Int64).alias("bytes"),
        pl.lit(None, pl.Utf8).alias("group"), pl.lit(None, pl.Int32).alias("group_size"))
    parts.append(api)
    t = pl.concat([p.with_columns(pl.col("group_size").cast(pl.Int32)) for p in parts], how="vertical_relaxed")
    # step: the ProfilerStep#N annotation that contains the CPU-side time (issue) of each row
    steps = ev.filter((pl.col("cat") == "user_annotation") & pl.col("name").str.starts_with("ProfilerStep#")).select(
        *key, pl.col("ts_ns").alias("_s"), pl.col("end_ns").alias("_e"),
        pl.col("name").str.extract(r"#(\d+)").cast(pl.Int64).alias("step")).sort("_s")
    t = t.sort("issue_ns").join_asof(steps, left_on="issue_ns", right_on="_s", by=key, strategy="backward",
                                     check_sortedness=False)
    t = t.with_columns(pl.when(pl.col("issue_ns") <= pl.col("_e")).then(pl.col("step")).alias("step")).drop("_s", "_e")
    return t.with_columns(pl.lit(None, pl.Float64).alias("flops"), pl.lit(None, pl.Utf8).alias("shape")).sort(*key, "start_ns")
