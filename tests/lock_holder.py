"""Another live process holding one of mlm_adapt's locks, for the tests of what a second writer is told."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HOLDER = """
import sys
from pathlib import Path
from mlm_adapt.guard import locks
with getattr(locks, sys.argv[1])(Path(sys.argv[2]), *sys.argv[3:]):
    print("locked", flush=True)
    sys.stdin.read()  # held until the test closes stdin
"""


@contextmanager
def held_lock(function: str, target: Path, *args: str) -> Iterator[int]:
    """A process holding ``mlm_adapt.guard.locks.<function>(target, *args)`` for the block; yields its pid."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    owner = subprocess.Popen(
        [sys.executable, "-c", HOLDER, function, str(target), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert owner.stdout.readline().strip() == "locked"
        yield owner.pid
    finally:
        owner.stdin.close()
        assert owner.wait(timeout=60) == 0
