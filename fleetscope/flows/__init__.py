"""Black-box flow analytics (LLMPrism): job recognition, comm-type labels, step timelines and
flow verdicts from switch-mirrored flow records. Entry point: analyze_window -> Analysis."""
from fleetscope.flows.config import FlowConfig  # noqa: F401
from fleetscope.flows.schemas import COMM_PAIRS, FLOW_BACKGROUND, JOB_CLUSTERS, JOBS, STEP_TIMELINES  # noqa: F401
from fleetscope.flows.timelines import export_perfetto, perfetto_trace  # noqa: F401
from fleetscope.flows.window import analyze_window  # noqa: F401
