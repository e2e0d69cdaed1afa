"""Every warehouse table, gathered from where it is declared (`DECLARED` beside each module's schemas:
the landed tables in schemas/landing.py and ingest/captures.py, each analysis' in its schemas module,
the findings' in findings/verdicts.py and findings/problems.py). docs/CONTRACT.md section 2 names the
public ones; docs/TABLES.md lists them all (`python -m fleetscope.tables > docs/TABLES.md`). The
warehouse creates an empty placeholder for each, so every DuckDB view exists, and SQL over it works,
before the first row lands."""
from __future__ import annotations

import sys

import pandera.polars as pa

from fleetscope.findings import problems, verdicts
from fleetscope.flows import schemas as flows
from fleetscope.ingest import captures
from fleetscope.perftracker import schemas as perftracker
from fleetscope.prism import schemas as prism
from fleetscope.schemas import landing
from fleetscope.schemas.base import Table
from fleetscope.traces import schemas as traces
from fleetscope.xputimer import schemas as xputimer

# (section of the list, declarations), in the order data flows
SECTIONS: tuple[tuple[str, tuple[Table, ...]], ...] = (
    ("landing -> ingest", landing.DECLARED + captures.DECLARED),
    ("flows (LLMPrism)", flows.DECLARED),
    ("traces (Lumos)", traces.DECLARED),
    ("perftracker", perftracker.DECLARED),
    ("xputimer", xputimer.DECLARED),
    ("prism", prism.DECLARED),
    ("verdicts and what people read", verdicts.DECLARED + problems.DECLARED),
)
DECLARED: dict[str, Table] = {t.name: t for _, group in SECTIONS for t in group}
TABLES: dict[str, pa.DataFrameSchema] = {name: t.schema for name, t in DECLARED.items()}


def markdown() -> str:
    """The table list people read (docs/TABLES.md), made from the declarations."""
    out = ["# Warehouse tables", "",
           "Generated from the declarations (`python -m fleetscope.tables > docs/TABLES.md`; a test checks it is current).",
           "Columns and types: `DESCRIBE <table>` in `fleetscope sql`, or the asset's page in the UI.", ""]
    for title, group in SECTIONS:
        out += [f"## {title}", "", "| table | holds | partitions | reads |", "|---|---|---|---|"]
        out += [f"| {t.name} | {t.description} | {t.partitions} | {', '.join(t.reads) or '-'} |" for t in group]
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(markdown())
