"""Landing-zone ingestion: one module per landing kind, each a plain function from a landed
file to an IngestResult (kept rows validated against the kind's schema, rejected rows with
reasons). Dagster assets in assets/ingest.py call these; tests call them directly."""
from fleetscope.ingest.tabular import IngestError, IngestResult  # noqa: F401
