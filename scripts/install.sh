#!/usr/bin/env bash
# Installs heed and its test tools into $VENV. Called by the Makefile; safe to re-run.
set -euo pipefail
VENV=${VENV:-.venv}
PIP="$VENV/bin/python -m pip"
$PIP install -q -e '.[dev]'
