#!/usr/bin/env bash
# Rewrite constraints.txt from the current virtualenv (after changing pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
{
  echo "# Exact versions fleetscope is tested with (pip install -c constraints.txt ...). Regenerate with"
  echo "# scripts/lock.sh. torch is not here: only collectors need it (pip install torch==2.13.0)."
  .venv/bin/pip freeze --exclude-editable | grep -v -e '^torch==' -e '^fleetscope'
} > constraints.txt
