"""Black-box flow analytics (LLMPrism): job recognition, comm-type labels, step timelines and
flow verdicts from switch-mirrored flow records. Entry point: analyze_window."""
from fleetscope.flows.config import FlowConfig  # noqa: F401
from fleetscope.flows.schemas import COMM_PAIRS, JOB_CLUSTERS, JOBS, STEP_TIMELINES  # noqa: F401
from fleetscope.flows.timelines import export_perfetto  # noqa: F401
from fleetscope.flows.window import FLOW_BACKGROUND, analyze_window, window_id_for  # noqa: F401
