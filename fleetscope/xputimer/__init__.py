"""XPUTimer (aggregated metrics, slowdown detectors, hang diagnosis) and PerfTracker 4.1
(degradation detection -> profiling requests) over the normalized timings frame.

    from fleetscope.xputimer import detectors, metrics, degradation, hang
    out = detectors.analyze(timings, history=healthy_timings, job_id=...)   # tables + out["verdicts"]
    iters, degr = degradation.detect_degradation(timings)
    degradation.write_profile_request(landing, job_id, degr.row(0, named=True))
    ranks, verdicts = hang.diagnose_all(landing / "stacks", job_id=...)

Importing this package registers the schemas of every table it produces (schemas.py). No torch here.
"""
from fleetscope.xputimer import schemas  # noqa: F401  (registers the tables)
