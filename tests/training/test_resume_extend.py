"""Training a finished run longer: ``fit --ckpt_path last --trainer.max_steps`` larger continues exactly
where the run stopped, whichever callback wrote ``last.ckpt``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import run_cli, tiny_fit_args
from recorder import read_records

from mlm_adapt.training.exact_resume import as_saved_in_the_epoch
from mlm_adapt.training.resume import epochs_trained, nothing_to_train

LONGER = 10
KEY = ("step", "epoch", "batch_idx", "ids", "digest")
# Where last.ckpt is written as the first run ends (epochs of 6 batches).
WRITERS = {
    "validation": ("--trainer.val_check_interval=3",),
    "epoch_end": (),  # validation at epoch ends only: ModelCheckpoint saves in on_train_epoch_end
    "every_n_train_steps": ("--trainer.callbacks.every_n_train_steps=2",),
}


def _fit(
    model_dir: Path,
    corpus: Path,
    root: Path,
    shared: Path,
    steps: int,
    *extra: str,
    writer: str = "validation",
):
    return run_cli(
        "fit",
        *tiny_fit_args(
            model_dir,
            corpus,
            root,
            f"--trainer.max_steps={steps}",
            "--trainer.limit_train_batches=6",
            # A schedule that does not depend on max_steps: the longer run's steps are the same steps.
            "--model.lr_schedule=constant",
            "--model.warmup=0",
            "--trainer.callbacks+=ModelCheckpoint",
            f"--trainer.callbacks.dirpath={root / 'ckpt'}",
            "--trainer.callbacks.save_last=true",
            *WRITERS[writer],
            "--trainer.callbacks+=tests.recorder.BatchRecorder",
            f"--trainer.callbacks.out_dir={root / 'rec'}",
            *extra,
            f"--data.cache_dir={shared}",
            "--export.overwrite=true",
        ),
    )


@pytest.fixture(scope="module")
def longer_run(tmp_path_factory, tiny_model_dir, review_texts) -> tuple[Path, Path, Path]:
    """The uninterrupted run of :data:`LONGER` steps, its corpus, and the preprocessing cache all share."""
    root = tmp_path_factory.mktemp("longer")
    corpus = root / "reviews.txt"
    corpus.write_text("\n".join(review_texts) + "\n", encoding="utf-8")
    result = _fit(tiny_model_dir, corpus, root / "run", root / "hf_cache", LONGER)
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "run", corpus, root / "hf_cache"


def _assert_same_steps(run: Path, reference: Path) -> None:
    expected, got = read_records(reference / "rec"), read_records(run / "rec")
    assert [{k: r.get(k) for k in KEY} for r in got] == [{k: r.get(k) for k in KEY} for r in expected]
    losses, reference_losses = (
        [r["loss"] for r in read_records(directory / "rec", kind="loss")] for directory in (run, reference)
    )
    assert losses == pytest.approx(reference_losses, abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("writer", list(WRITERS))
@pytest.mark.parametrize("first_steps", [4, 6], ids=["mid_epoch", "epoch_end"])
def test_a_finished_run_trained_longer_continues_as_one_longer_run(
    tiny_model_dir, tmp_path, longer_run, writer, first_steps
):
    reference, corpus, shared = longer_run
    run = tmp_path / "run"
    first = _fit(tiny_model_dir, corpus, run, shared, first_steps, writer=writer)
    assert first.returncode == 0, first.stderr[-3000:]
    more = _fit(tiny_model_dir, corpus, run, shared, LONGER, "--ckpt_path=last", writer=writer)
    assert more.returncode == 0, more.stderr[-3000:]
    _assert_same_steps(run, reference)


@pytest.mark.slow
def test_a_run_stopped_by_a_signal_and_trained_longer_continues_as_one_longer_run(
    tiny_model_dir, tmp_path, longer_run
):
    reference, corpus, shared = longer_run
    run = tmp_path / "run"
    stop = ("--trainer.callbacks.kill_at_step=4", "--trainer.callbacks.kill_signal=SIGTERM")
    first = _fit(tiny_model_dir, corpus, run, shared, 6, *stop)
    assert first.returncode == 143, first.stderr[-3000:]
    more = _fit(tiny_model_dir, corpus, run, shared, LONGER, "--ckpt_path=last")
    assert more.returncode == 0, more.stderr[-3000:]
    _assert_same_steps(run, reference)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("max_steps", [6, 4], ids=["same_length", "shorter"])
def test_a_finished_run_run_again_trains_nothing_and_leaves_its_files(
    tiny_model_dir, trained_run, tmp_path, max_steps
):
    """The run's checkpoint already reached ``max_steps``: one line, exit 0, not a file written (before, the
    export was written again with the step-3 validation's metrics as the step-6 weights' "after")."""
    root = tmp_path / "run"
    root.mkdir()
    for name in ("checkpoints", "export"):
        shutil.copytree(trained_run / name, root / name)
    shutil.copy(trained_run / "reviews.txt", root / "reviews.txt")
    before = _files(root)
    last = root / "checkpoints" / "last.ckpt"
    result = run_cli(
        "fit",
        *tiny_fit_args(
            tiny_model_dir,
            root / "reviews.txt",
            root,
            "--trainer.val_check_interval=3",
            "--trainer.callbacks+=ModelCheckpoint",
            f"--trainer.callbacks.dirpath={root / 'checkpoints'}",
            "--trainer.callbacks.monitor=val/loss",
            "--trainer.callbacks.save_last=true",
            f"--export.output_dir={root / 'export'}",
            "--export.overwrite=true",
            f"--trainer.max_steps={max_steps}",
            f"--ckpt_path={last}",
        ),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("mlm_adapt fit:")]
    assert lines == [
        f"mlm_adapt fit: ckpt_path: {last} already trained 6 steps, reaching trainer.max_steps {max_steps}: "
        "nothing to train, the export is left as it is; to train longer, raise "
        "--trainer.max_steps (or --trainer.max_epochs) above it"
    ], result.stderr[-3000:]
    assert _files(root) == before


def _loops(started: int, processed: int, completed: int, last_batch: bool) -> dict:
    counts = {"ready": started, "started": started, "processed": processed, "completed": completed}
    return {
        "global_step": 12,
        "loops": {
            "fit_loop": {
                "epoch_progress": {"total": dict(counts), "current": dict(counts)},
                "epoch_loop.batch_progress": {"is_last_batch": last_batch},
            }
        },
    }


@pytest.mark.parametrize(
    "saved, expected",
    [
        ((1, 1, 0, False), (0, 0)),  # on_train_epoch_end at max_steps, data left: still in epoch 0
        ((1, 1, 1, False), (0, 0)),  # on_train_end (the last validation): the same
        ((1, 1, 1, True), (0, 0)),  # the epoch's last batch: Lightning finishes epoch 0, then starts 1
        ((2, 1, 1, False), (1, 1)),  # saved within epoch 1: left as Lightning wrote it
    ],
)
def test_a_checkpoint_saved_after_the_epoch_loop_reads_as_saved_in_its_epoch(saved, expected):
    checkpoint = _loops(*saved)
    as_saved_in_the_epoch(checkpoint)
    for counts in checkpoint["loops"]["fit_loop"]["epoch_progress"].values():
        assert (counts["processed"], counts["completed"]) == expected
        assert (counts["ready"], counts["started"]) == (saved[0], saved[0])


def test_nothing_to_train_counts_steps_and_whole_epochs():
    mid_epoch, epoch_end = _loops(1, 0, 0, False), _loops(1, 0, 0, True)
    assert epochs_trained(mid_epoch) == 0 and epochs_trained(epoch_end) == 1
    assert nothing_to_train("c.ckpt", mid_epoch, 20, None) is None
    assert nothing_to_train("c.ckpt", mid_epoch, -1, 1) is None
    assert nothing_to_train("c.ckpt", mid_epoch, -1, None) is None  # Lightning's default: 1000 epochs
    assert "already trained 12 steps, reaching trainer.max_steps 12:" in nothing_to_train(
        "c.ckpt", mid_epoch, 12, None
    )
    assert "already trained 1 epochs (12 steps), reaching trainer.max_epochs 1:" in nothing_to_train(
        "c.ckpt", epoch_end, -1, 1
    )
