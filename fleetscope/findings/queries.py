"""The saved SQL queries (sql/*.sql): what each answers and which variables it reads, parsed from
the files themselves (first line `-- NAME: question`; a `-- Variables ...:` block listing
`--   name  description (default: ...)`), so `fleetscope sql --help` and the files never disagree."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from fleetscope.project import SQL_DIR

_VAR_USE = re.compile(r"getvariable\('([A-Za-z_][A-Za-z0-9_]*)'\)")
_VAR_DOC = re.compile(r"^--\s{3}([A-Za-z_][A-Za-z0-9_]*)\s{2,}(.*)$")


@dataclass
class SavedQuery:
    name: str
    question: str
    sql: str
    variables: dict[str, str] = field(default_factory=dict)   # name -> description (with its default)


def saved_queries() -> dict[str, SavedQuery]:
    out = {}
    for p in sorted(SQL_DIR.glob("*.sql")):
        text = p.read_text()
        first = text.splitlines()[0] if text else ""
        question = first.split(":", 1)[1].strip() if first.startswith(f"-- {p.stem}:") else ""
        doc, in_block = {}, False
        for line in text.splitlines():
            if not line.startswith("--"):
                break
            if line.startswith("-- Variables"):
                in_block = True
                continue
            m = _VAR_DOC.match(line) if in_block else None
            if m:
                doc[m.group(1)] = m.group(2).strip()
        used = dict.fromkeys(_VAR_USE.findall(text))
        out[p.stem] = SavedQuery(p.stem, question, text, {v: doc.get(v, "") for v in used})
    return out


def variables_used(sql: str) -> list[str]:
    return list(dict.fromkeys(_VAR_USE.findall(sql)))
