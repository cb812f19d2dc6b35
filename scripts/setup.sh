#!/usr/bin/env bash
# Creates .venv and installs mlm_adapt with its dev extras. Idempotent; safe to re-run.
# TORCH_SPEC picks the torch build (default: the CPU wheel pinned for this project's CI machines;
# on a GPU machine use e.g. TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu124").
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip 2>/dev/null || true
# shellcheck disable=SC2086
.venv/bin/pip install -q ${TORCH_SPEC:-torch==2.13.0}
.venv/bin/pip install -q -e ".[dev]"
