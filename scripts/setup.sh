#!/usr/bin/env bash
# Creates .venv and installs mlm_adapt with its dev extras. Idempotent; safe to re-run; silent on success
# (pip's errors still reach stderr and stop the script).
# TORCH_SPEC picks the torch build (default: the CPU wheel pinned for this project's CI machines;
# on a GPU machine use e.g. TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu124").
set -euo pipefail
cd "$(dirname "$0")/.."
# pip's chatter that is not about this install: the new-release notice and the running-as-root warning
# (containers and CI run as root).
# -qq keeps pip's own warnings about this machine's index configuration out; PYTHONWARNINGS silences the
# build backend's generic "editable installation" notice. Errors still print.
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_PROGRESS_BAR=off PYTHONWARNINGS=ignore
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip 2>/dev/null || true  # optional: an offline mirror may lack it
# shellcheck disable=SC2086
.venv/bin/pip install -qq ${TORCH_SPEC:-torch==2.13.0}
.venv/bin/pip install -qq -e ".[dev]"
