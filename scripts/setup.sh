#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv and install
# fnlcore into it. Idempotent: re-running with unchanged requirements is fast.
# Needs only python3 (>= 3.11) with venv and pip.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.fnl-requirements.sha256
want=$(cat requirements.txt requirements-dev.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install --disable-pip-version-check -q -r requirements-dev.txt 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  .venv/bin/python -m pip install --disable-pip-version-check -q --no-deps -e . 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  echo "$want" > "$stamp"
fi
.venv/bin/python -c "import fnlcore, torch, snakemake" || { echo "setup.sh: the environment is broken; delete .venv and re-run" >&2; exit 1; }
