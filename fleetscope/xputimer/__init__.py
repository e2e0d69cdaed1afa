"""XPUTimer (aggregated metrics, slowdown detectors, hang diagnosis) and PerfTracker 4.1
(degradation detection -> profiling requests) over the normalized timings frame.

    analyze_capture(timings, history=healthy_timings, job_id=...) -> Analysis   (analyze.py)
    analyze_hang(landing / "stacks" / incident, job_id=...) -> Analysis
Building blocks: detectors.analyze (metric tables + verdicts), metrics, degradation.detect_degradation /
write_profile_request, hang.diagnose_hang. No torch here."""
from fleetscope.xputimer.analyze import analyze_capture, analyze_hang  # noqa: F401
