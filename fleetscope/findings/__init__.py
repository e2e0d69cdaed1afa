"""What fleetscope concludes and shows people: the verdict rows every analysis writes (verdicts),
the problems they merge into (problems), incident requests (incidents), text, markdown and plots
(reports), Perfetto timelines (exports) and the saved SQL queries (queries)."""
