#!/usr/bin/env bash
# Creates .venv and installs mlm_adapt with its dev extras. Idempotent; safe to re-run; silent on success
# (pip's errors still reach stderr and stop the script).
# TORCH_SPEC overrides the torch build, e.g. TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu124";
# without it: torch 2.13.0, the CPU build where no GPU is present (no nvidia-smi), else PyPI's CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
# pip's chatter that is not about this install: the new-release notice and the running-as-root warning
# (containers and CI run as root).
# -qq keeps pip's own warnings about this machine's index configuration out; PYTHONWARNINGS silences the
# build backend's generic "editable installation" notice. Errors still print.
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_PROGRESS_BAR=off PYTHONWARNINGS=ignore
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip 2>/dev/null || true  # optional: an offline mirror may lack it
# torch first, and by build: PyPI's Linux `torch==2.13.0` is the multi-GB CUDA build, so a machine without
# a GPU asks for the `+cpu` local version explicitly. It comes from a local wheel directory or mirror where
# pip's configuration has one, else from PyTorch's CPU index (tried second, so that an offline machine never
# waits on an index it cannot reach).
if [ -n "${TORCH_SPEC:-}" ]; then
    # shellcheck disable=SC2086
    .venv/bin/pip install -qq $TORCH_SPEC
elif command -v nvidia-smi >/dev/null 2>&1; then
    .venv/bin/pip install -qq "torch==2.13.0"
else
    .venv/bin/pip install -qq "torch==2.13.0+cpu" 2>/dev/null \
        || .venv/bin/pip install -qq "torch==2.13.0+cpu" --index-url https://download.pytorch.org/whl/cpu
fi
.venv/bin/pip install -qq -e ".[dev]"
# The trainer commands' --help, built once here: LightningCLI needs the whole training stack to build their
# parser, and they then answer from mlm_adapt/cli/help_cache.py at once. Formatted for this terminal's width
# (the cache key holds it; another width builds its own the first time).
columns=$({ stty size </dev/tty; } 2>/dev/null | cut -d' ' -f2 || true)
for command in fit validate test; do
    COLUMNS=${columns:-${COLUMNS:-80}} .venv/bin/python -m mlm_adapt "$command" --help >/dev/null &
done
wait
