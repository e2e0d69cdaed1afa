-- verdicts_by_team: whose problem is it? Verdicts per team (algorithm = user code and configuration,
-- infrastructure = framework / kernels / libraries, operations = hardware, network, hosts) and
-- severity, with how many subjects and jobs they touch, the scopes and detectors involved, how many
-- fall in the last 24 hours of the warehouse's newest verdict, and the most recent explanation.
-- Every verdict counts here, including those without a time span.
WITH v AS (SELECT *, coalesce(end_ns, start_ns) AS t_ns FROM anomaly_verdicts),
params AS (SELECT max(t_ns) AS as_of_ns FROM v)
SELECT team, severity,
       count(*) AS verdicts,
       count(*) FILTER (WHERE t_ns > p.as_of_ns - 86400000000000) AS last_24h,
       count(DISTINCT scope || ':' || subject) AS subjects,
       count(DISTINCT job_id) AS jobs,
       string_agg(DISTINCT scope, ', ' ORDER BY scope) AS scopes,
       string_agg(DISTINCT detector, ', ' ORDER BY detector) AS detectors,
       make_timestamp_ns(max(t_ns)) AS last_seen,
       arg_max(explanation, (coalesce(t_ns, 0), explanation)) AS latest_explanation
FROM v, params p
GROUP BY team, severity
ORDER BY team, CASE severity WHEN 'critical' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END;
