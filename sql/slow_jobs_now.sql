-- slow_jobs_now: which jobs are running slowest right now compared with their own usual step time?
-- One row per job with steps in the recent window, slowest first (ties: by vs_own_p25): the median step time of its
-- recent steps (per GPU, from step_timelines) over the median of its steps before that window
-- (all of its steps when it has no earlier history). slowdown 1.0 = as usual; 1.5 = 50% slower.
-- "Now" is the newest step end in the warehouse, so the query also works on replayed or late data.
-- The recent window is the last 10 minutes, or the last third of a job's own span when the job has
-- run for less than 30 minutes (so a short run still has a history to compare with).
-- vs_own_p25: recent median over the job's 25th-percentile step time, which still shows a job that
-- has been slow for most of its life (its median is then the slow pace, so slowdown stays ~1.0).
-- Variables (`fleetscope sql NAME --var name=value`; in the duckdb shell `SET VARIABLE name = value;`):
--   recent_minutes  length of the recent window, minutes (default: 10, or a third of the job's span when shorter)
--   as_of_ns        evaluate as of this time, ns since the epoch (default: the newest step end)
WITH gpu_steps AS (   -- one row per (job, GPU, step); DISTINCT drops a step seen by two windows
    SELECT DISTINCT job_id, ip, start_ns, end_ns, end_ns - start_ns AS step_ns
    FROM step_timelines
    WHERE end_ns > start_ns
),
params AS (
    SELECT coalesce(getvariable('as_of_ns')::BIGINT, max(end_ns)) AS as_of_ns FROM gpu_steps
),
windows AS (          -- per job: 10 minutes, or a third of the job's own span up to now when shorter
    SELECT s.job_id, p.as_of_ns,
           CAST(coalesce(getvariable('recent_minutes')::DOUBLE * 60e9,
                         least(600e9, (p.as_of_ns - min(s.start_ns)) / 3.0)) AS BIGINT) AS recent_ns
    FROM gpu_steps s, params p
    WHERE s.start_ns <= p.as_of_ns
    GROUP BY s.job_id, p.as_of_ns
),
tagged AS (
    SELECT s.*, s.end_ns > w.as_of_ns - w.recent_ns AS recent, w.as_of_ns, w.recent_ns
    FROM gpu_steps s JOIN windows w USING (job_id)
    WHERE s.end_ns <= w.as_of_ns
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
