"""``python -m mlm_adapt`` in a fresh process, without paying the imports each time.

Importing torch, Lightning, transformers and datasets costs ~12 s of CPU per interpreter on the 2-core
development machine, most of what a tiny CLI fit costs. The suite's CLI runs are therefore forked from a
server process (``multiprocessing``'s forkserver, one per pytest worker) that imported mlm_adapt once and
has run nothing: each command still gets its own process (own pid, signals, exit code, ``sys.argv``,
environment, working directory and stdout/stderr), as with ``python -m mlm_adapt``, but starts in
milliseconds. What a library reads from the environment at import time (``OMP_NUM_THREADS`` for torch's
thread pool, ``HF_HUB_OFFLINE`` for huggingface_hub's constants) keeps the server's value, set by conftest
before the first fork; the rest of a test's environment applies. A forked command ends with ``os._exit``
(no interpreter shutdown), so a test of what a user's terminal shows at exit asks ``run_cli`` for
``fresh_interpreter=True``. DDP's second rank is a new interpreter either way (Lightning relaunches
``sys.argv``, which is set as ``python -m mlm_adapt`` sets it).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlm_adapt

_CONTEXT = multiprocessing.get_context("forkserver")
# The command line imports a command's stack when the command runs (mlm_adapt.cli.commands itself is
# light): the server imports every command's, so that a forked command finds them loaded.
_PRELOAD = [
    "mlm_adapt.cli.commands",
    "mlm_adapt.cli.fit",
    "mlm_adapt.data.prepared",
    "mlm_adapt.export.callback",
    "mlm_adapt.model.checkpoints",
    "mlm_adapt.model.loading",
    "mlm_adapt.model.metrics",
    "mlm_adapt.text.tokenizer",
    "pandas",
]
_CONTEXT.set_forkserver_preload([*_PRELOAD, "cli_process"])
_MAIN = str(Path(mlm_adapt.__file__).parent / "__main__.py")


def _command(
    args: list[str], cwd: str | None, env: dict[str, str], out: str, err: str, code: str | None = None
) -> None:
    """The child: what ``python -m mlm_adapt ARGS`` (or ``python -c CODE ARGS``) does once its imports
    are done."""
    from mlm_adapt.cli.commands import main  # noqa: PLC0415 - preloaded by the server: no cost

    os.environ.clear()
    os.environ.update(env)
    # What a new interpreter would take from PYTHONPATH (e.g. a test's own callback modules).
    sys.path[:0] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    if cwd:
        os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # A forkserver child inherits "forkserver" as its default start method; a new interpreter has the
    # platform's. Kept, the command's DataLoader workers would be children of a server of its own that
    # outlives a SIGKILLed command, so that they never see their parent go and run on after the test.
    multiprocessing.set_start_method(None, force=True)
    if code is not None:
        sys.argv = ["-c", *args]
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102 - the test's own code
        return
    sys.argv = [_MAIN, *args]
    main()


class CliProcess:
    """A running ``python -m mlm_adapt ARGS`` (or ``python -c CODE ARGS``): the subset of
    ``subprocess.Popen`` the tests use."""

    def __init__(
        self,
        args: list[str],
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        code: str | None = None,
    ):
        self.args = ["python", "-c", "..."] + args if code is not None else ["mlm_adapt", *args]
        self._streams = Path(tempfile.mkdtemp(prefix="mlm_adapt-cli-"))
        self._out, self._err = self._streams / "stdout", self._streams / "stderr"
        self._out.touch()
        self._err.touch()
        self._process = _CONTEXT.Process(
            target=_command,
            args=(
                list(args),
                str(cwd) if cwd else None,
                dict(env or os.environ),
                str(self._out),
                str(self._err),
                code,
            ),
        )
        self._process.start()
        self.pid = self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def send_signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Waits for the process (killing it after ``timeout`` s) and returns its stdout and stderr."""
        self._process.join(timeout)
        if self._process.exitcode is None:
            self._process.kill()
            self._process.join()
            raise subprocess.TimeoutExpired(self.args, timeout, *self._read())
        return self._read()

    def _read(self) -> tuple[str, str]:
        out = self._out.read_text(encoding="utf-8", errors="replace")
        err = self._err.read_text(encoding="utf-8", errors="replace")
        shutil.rmtree(self._streams, ignore_errors=True)
        return out, err


def prepare_args(model: Path, corpus: Path, target: Path, cache: Path, *extra: str) -> list[str]:
    """``prepare`` of ``corpus`` into ``target`` with a tiny model, no progress bars, then ``extra``."""
    return [
        "prepare", f"--model.model_name_or_path={model}", "--model.max_seq_length=64",
        f"--data.train_files=[{corpus}]", f"--data.prepared_dir={target}", f"--data.cache_dir={cache}",
        "--trainer.enable_progress_bar=false", *extra,
    ]  # fmt: skip


def run_command(
    args: list[str],
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    code: str | None = None,
) -> subprocess.CompletedProcess:
    """Runs ``python -m mlm_adapt ARGS`` (or ``python -c CODE ARGS``) in a forked process; returns what
    ``subprocess.run`` would."""
    process = CliProcess(args, cwd, env, code)
    out, err = process.communicate(timeout)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def child_pids(pid: int) -> list[int]:
    """The processes ``pid`` started that are still its children (Linux ``/proc``; none elsewhere)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def descendant_pids(pid: int) -> list[int]:
    """Every process below ``pid``: its children, theirs, and so on."""
    found, todo = [], [pid]
    while todo:
        below = child_pids(todo.pop())
        found += below
        todo += below
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, waiting to be reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def wait_gone(pids: list[int], seconds: float = 10) -> list[int]:
    """Waits up to ``seconds`` for ``pids`` to end; returns those still alive."""
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]
