-- slow_jobs_now: which jobs are running slowest right now compared with their own usual step time?
-- One row per job with steps in the recent window, slowest first (ties: by vs_own_p25): the median step time of its
-- recent steps (per GPU, from step_timelines) over the median of its steps before that window
-- (all of its steps when it has no earlier history). slowdown 1.0 = as usual; 1.5 = 50% slower.
-- "Now" is the newest step end in the warehouse, so the query also works on replayed or late data.
-- vs_own_p25: recent median over the job's 25th-percentile step time, which still shows a job that
-- has been slow for most of its life (its median is then the slow pace, so slowdown stays ~1.0).
-- Optional (DuckDB variables; works in `duckdb -readonly FILE` and `fleetscope sql`):
--   SET VARIABLE recent_minutes = 10;                  -- length of the recent window (default 10)
--   SET VARIABLE as_of_ns = 1795262460000000000;       -- evaluate as of this time (ns since epoch)
WITH gpu_steps AS (   -- one row per (job, GPU, step); DISTINCT drops a step seen by two windows
    SELECT DISTINCT job_id, ip, start_ns, end_ns, end_ns - start_ns AS step_ns
    FROM step_timelines
    WHERE end_ns > start_ns
),
params AS (
    SELECT coalesce(getvariable('as_of_ns')::BIGINT, max(end_ns)) AS as_of_ns,
           CAST(coalesce(getvariable('recent_minutes')::DOUBLE, 10) * 60e9 AS BIGINT) AS recent_ns
    FROM gpu_steps
),
tagged AS (
    SELECT s.*, s.end_ns > p.as_of_ns - p.recent_ns AS recent, p.as_of_ns, p.recent_ns
    FROM gpu_steps s, params p
    WHERE s.end_ns <= p.as_of_ns
),
per_job AS (
    SELECT job_id,
           count(DISTINCT ip) AS gpus,
           median(step_ns) FILTER (WHERE recent) AS recent_step_ns,
           count(*) FILTER (WHERE recent) AS recent_gpu_steps,
           median(step_ns) FILTER (WHERE NOT recent) AS earlier_step_ns,
           count(*) FILTER (WHERE NOT recent) AS earlier_gpu_steps,
           median(step_ns) AS all_step_ns,
           quantile_cont(step_ns, 0.25) AS p25_step_ns,
           max(end_ns) AS last_end_ns,
           any_value(as_of_ns) AS as_of_ns,
           any_value(recent_ns) AS recent_ns
    FROM tagged
    GROUP BY job_id
),
job_verdicts AS (     -- warning/critical findings about the job in the same recent window
    SELECT v.job_id, count(*) AS recent_verdicts
    FROM anomaly_verdicts v JOIN per_job j ON v.job_id = j.job_id
    WHERE v.severity IN ('warning', 'critical')
      AND coalesce(v.end_ns, v.start_ns) > j.as_of_ns - j.recent_ns
    GROUP BY v.job_id
)
SELECT j.job_id,
       round(j.recent_step_ns / coalesce(j.earlier_step_ns, j.all_step_ns), 3) AS slowdown,
       round(j.recent_step_ns / j.p25_step_ns, 3) AS vs_own_p25,
       round(j.recent_step_ns / 1e6, 1) AS recent_step_ms,
       round(coalesce(j.earlier_step_ns, j.all_step_ns) / 1e6, 1) AS usual_step_ms,
       CASE WHEN j.earlier_step_ns IS NULL THEN 'all steps (no history before the recent window)'
            ELSE 'steps before the recent window' END AS usual_from,
       j.gpus,
       CAST(round(j.recent_gpu_steps / j.gpus) AS BIGINT) AS recent_steps,
       coalesce(v.recent_verdicts, 0) AS recent_verdicts,
       make_timestamp_ns(j.last_end_ns) AS last_step_end
FROM per_job j LEFT JOIN job_verdicts v ON v.job_id = j.job_id
WHERE j.recent_gpu_steps > 0
ORDER BY slowdown DESC, vs_own_p25 DESC, j.job_id;
