"""Pandera (polars backend) schema helpers, and the schemas of the landing tables (landing.py).
Each analysis package keeps its tables' schemas in its own schemas.py; fleetscope.tables lists
every warehouse table explicitly."""
from fleetscope.schemas.base import (  # noqa: F401
    ValidationResult,
    conform,
    empty_frame,
    polars_schema,
    validate_rows,
)
