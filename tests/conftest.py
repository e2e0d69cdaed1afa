
import pytest

from fleetscope.common import sigterm_default
from tests.paths import REAL, REPO  # noqa: F401


@pytest.fixture
def fleet_env(tmp_path, monkeypatch):
    """A landing folder, a warehouse path and a real Dagster instance home, all under tmp_path."""
    landing = tmp_path / "landing"
    landing.mkdir()
    warehouse = tmp_path / "wh" / "warehouse.duckdb"
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("FLEETSCOPE_LANDING", str(landing))
    monkeypatch.setenv("FLEETSCOPE_WAREHOUSE", str(warehouse))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    return landing, warehouse, home


@pytest.fixture(autouse=True)
def _sigterm_default():
    """An in-process Dagster run in an earlier test may have left SIGTERM ignored (the suite run in the
    background): the processes a later test starts (a UI session, a Dask worker) could not be stopped."""
    sigterm_default()
    yield
