-- job_timeline: a job's steps, one row per step: when it started, how long it took across its GPUs,
-- which GPU was slowest, its DP communication phase, and the warning/critical verdicts overlapping it.
-- Which job: the variable job_id, else the most recent job (the newest step end).
--   fleetscope sql job_timeline --var job_id=job-62f6d3586443
--   fleetscope sql job_timeline                       (the most recent job)
-- An unknown job_id stops with an error that says so (not an empty answer).
-- Variables (`fleetscope sql NAME --var name=value`; in the duckdb shell `SET VARIABLE name = value;`):
--   job_id  the job to show (default: the job with the newest step)
WITH pick AS (
    SELECT CASE
             WHEN getvariable('job_id') IS NULL THEN
                 coalesce((SELECT arg_max(job_id, (end_ns, job_id)) FROM step_timelines),
                          error('job_timeline: step_timelines is empty (no job has been analysed yet)'))
             WHEN getvariable('job_id')::VARCHAR IN (SELECT job_id FROM step_timelines) THEN getvariable('job_id')::VARCHAR
             ELSE error('job_timeline: job_id ' || getvariable('job_id')::VARCHAR || ' is not in step_timelines; see SELECT DISTINCT job_id FROM step_timelines')
           END AS job_id
),
gpu_steps AS (        -- DISTINCT drops a step seen by two overlapping windows
    SELECT DISTINCT s.job_id, s.window_id, s.step, s.ip, s.start_ns, s.end_ns, s.dp_start_ns, s.dp_end_ns
    FROM step_timelines s JOIN pick USING (job_id)
),
steps AS (
    SELECT job_id, window_id, step,
           count(DISTINCT ip) AS gpus,
           min(start_ns) AS start_ns, max(end_ns) AS end_ns,
           median(end_ns - start_ns) AS step_ns,
           max(end_ns - start_ns) AS slowest_ns,
           arg_max(ip, (end_ns - start_ns, ip)) AS slowest_ip,  -- ties: the highest ip, so reruns agree
           median(dp_end_ns - dp_start_ns) AS dp_ns
    FROM gpu_steps
    GROUP BY job_id, window_id, step
),
overlapping AS (
    SELECT s.window_id, s.step, count(v.verdict_id) AS verdicts,
           string_agg(DISTINCT v.scope || ':' || v.subject, ', ' ORDER BY v.scope || ':' || v.subject) AS verdict_subjects
    FROM steps s JOIN anomaly_verdicts v
      ON v.job_id = s.job_id AND v.severity IN ('warning', 'critical')
     AND coalesce(v.start_ns, v.end_ns) <= s.end_ns AND coalesce(v.end_ns, v.start_ns) >= s.start_ns
    GROUP BY s.window_id, s.step
)
SELECT s.job_id, s.window_id, s.step,
       make_timestamp_ns(s.start_ns) AS start_time,
       round(s.step_ns / 1e6, 2) AS step_ms,
       round(s.slowest_ns / 1e6, 2) AS slowest_gpu_ms,
       s.slowest_ip,
       round(s.dp_ns / 1e6, 2) AS dp_comm_ms,
       s.gpus,
       coalesce(o.verdicts, 0) AS verdicts,
       o.verdict_subjects
FROM steps s LEFT JOIN overlapping o USING (window_id, step)
ORDER BY s.start_ns, s.window_id, s.step;
