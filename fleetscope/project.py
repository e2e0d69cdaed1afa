"""Where the project's non-Python files are: the saved queries (sql/) and the default Dagster
instance settings (dagster.yaml) sit in the checkout beside fleetscope/ (an editable install,
`pip install -e .`, which scripts/setup.sh makes)."""
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SQL_DIR = PROJECT_ROOT / "sql"
INSTANCE_YAML = PROJECT_ROOT / "dagster.yaml"
