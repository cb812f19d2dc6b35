"""The local cluster goes with the process that started it, however that ends, and a later start cleans up
only what an earlier start of this script left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from slurm_jobs import LOCAL_CLUSTER, cluster_missing

pytestmark = pytest.mark.cluster


@pytest.fixture(autouse=True)
def needs_slurm() -> None:
    reason = cluster_missing()
    if reason:
        pytest.skip(reason)


def processes_naming(directory: Path) -> list[str]:
    """The command lines of the running processes that name ``directory`` (its daemons, its supervisor)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            line = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(directory) in line and proc.name.isdigit() and int(proc.name) != os.getpid():
            found.append(f"{proc.name}: {line.strip()}")
    return found


def wait_until_gone(directory: Path, seconds: float = 60) -> list[str]:
    deadline = time.monotonic() + seconds
    while (left := processes_naming(directory)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


@pytest.fixture
def start_owned(tmp_path_factory) -> Iterator[Callable[[], tuple[Path, subprocess.Popen]]]:
    """Starts a cluster in a new directory from a process that then lives on as its owner; at the end, an
    owner still alive is killed and whatever is left in the directories is stopped."""
    made: list[tuple[Path, subprocess.Popen]] = []

    def start() -> tuple[Path, subprocess.Popen]:
        directory = tmp_path_factory.mktemp("slurm")  # short: munge's socket path has at most 108 bytes
        owner = subprocess.Popen(
            ["bash", "-c", f'bash "{LOCAL_CLUSTER}" start "{directory}" && echo started && exec sleep 600'],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        made.append((directory, owner))
        output = []
        for line in owner.stdout:
            output.append(line)
            if line.strip() == "started":
                return directory, owner
        raise AssertionError("".join(output))

    yield start
    for directory, owner in made:
        owner.kill()
        owner.wait(timeout=10)
        owner.stdout.close()
        subprocess.run(["bash", str(LOCAL_CLUSTER), "stop", str(directory)], timeout=120, check=False)


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(LOCAL_CLUSTER), *args], capture_output=True, text=True, timeout=120)


def test_the_cluster_stops_when_its_owner_is_killed_and_the_next_start_works(start_owned, tmp_path_factory):
    first, owner = start_owned()
    assert any("slurmctld" in line for line in processes_naming(first))
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=10)
    assert wait_until_gone(first) == []
    log = (first / "log" / "supervisor.log").read_text(encoding="utf-8")
    assert "which started this cluster, is gone; stopping it" in log
    second = tmp_path_factory.mktemp("slurm")
    try:
        again = run_script("start", str(second))
        assert again.returncode == 0, again.stdout + again.stderr
    finally:
        run_script("stop", str(second))
    assert wait_until_gone(second, seconds=10) == []


def test_a_start_stops_what_an_earlier_start_left_and_nothing_else(start_owned, tmp_path, tmp_path_factory):
    """The owner and the supervisor both killed (the daemons left behind): the next start stops those
    daemons, and a process that only looks like one (a slurmd naming a slurm.conf this script did not
    write) is not signalled."""
    users = tmp_path / "users"
    users.mkdir()
    (users / "slurm.conf").write_text("ClusterName=mine\n", encoding="utf-8")
    sleeper = f'{sys.executable} -c "import time; time.sleep(600)"'
    decoy = subprocess.Popen(["bash", "-c", f"exec -a slurmd {sleeper} -f {users}/slurm.conf"])
    second = tmp_path_factory.mktemp("slurm")
    try:
        first, owner = start_owned()
        os.kill(int((first / "pids" / "supervisor.pid").read_text()), signal.SIGKILL)
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        time.sleep(2)
        assert any("slurmctld" in line for line in processes_naming(first))  # left running
        again = run_script("start", str(second))
        assert again.returncode == 0, again.stdout + again.stderr
        assert f"stopping the cluster an earlier start left running in {first}" in again.stdout
        assert wait_until_gone(first, seconds=10) == []
        assert decoy.poll() is None  # never signalled
    finally:
        run_script("stop", str(second))
        decoy.kill()
        decoy.wait(timeout=10)
