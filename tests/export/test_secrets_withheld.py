"""A secret in a class's init arguments (a cloud segmenter's API key) reaches no file an export publishes and
no line the tool prints, and rotating it does not block a resume (mlm_adapt.guard.secrets)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_main, tiny_fit_args

from mlm_adapt.guard.secrets import WITHHELD, is_secret, secret_setting, withhold

KEY, ROTATED, MARKED = "sk-LIVE-4f1c2a", "sk-LIVE-9b7e3d", "es-private-5d8e"


class CloudSegmenter:
    """A cloud word segmenter's client: characters as words, offline (the key is only carried)."""

    def __init__(self, api_key: str, endpoint_secret: str = "", max_chars: int = 1, reject: bool = False):
        if reject:
            raise PermissionError("the service rejected the key")
        self.api_key, self.endpoint_secret, self.max_chars = api_key, endpoint_secret, max_chars

    def segment(self, texts: list[str]) -> list[list[str]]:
        return [list(text) for text in texts]


def segmenter(api_key: str = KEY, **init_args) -> str:
    spec = {"class_path": f"{__name__}.CloudSegmenter", "init_args": {"api_key": api_key, **init_args}}
    return f"--data.segmentation.segmenter={json.dumps(spec)}"


def secrets_in(root: Path) -> list[str]:
    """Every file under ``root`` holding a secret of this test."""
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        found += [f"{path}: {s}" for s in (KEY, ROTATED, MARKED) if s.encode() in data]
    return found


def run(args: list[str], capfd) -> tuple[int, str]:
    code, out, err = run_main(args, capfd)
    return code, out + err


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("api_key", True), ("hf_token", True), ("clientSecret", True), ("password", True),
        ("APIKey", True), ("endpoint_secret", True), ("auth", True), ("key_file", True),
        ("max_tokens", False), ("tokenizer", False), ("keep_punct", False), ("monkey", False),
        ("author", False),
    ],
)  # fmt: skip
def test_a_secret_is_an_init_argument_named_so(name, secret):
    assert is_secret(name) is secret


def test_withheld_at_any_depth_of_init_args_only():
    config = {
        "model": {"new_tokens_file": "t.txt", "tokenizer": "x"},  # options of the tool: never withheld
        "data": {
            "segmenter": {"class_path": "a.B", "init_args": {"api_key": "k", "opts": {"password": "p"}}}
        },
        "trainer": {"logger": [{"class_path": "W", "init_args": {"token": "t", "project": "law"}}]},
    }
    assert withhold(config) == {
        "model": {"new_tokens_file": "t.txt", "tokenizer": "x"},
        "data": {
            "segmenter": {
                "class_path": "a.B",
                "init_args": {"api_key": WITHHELD, "opts": {"password": WITHHELD}},
            }
        },
        "trainer": {"logger": [{"class_path": "W", "init_args": {"token": WITHHELD, "project": "law"}}]},
    }
    assert secret_setting("data.segmentation.segmenter.init_args.api_key") and not secret_setting(
        "data.segmentation.segmenter.class_path"
    )


def test_a_segmenters_key_is_published_nowhere_printed_never_and_rotates_across_a_resume(
    tiny_model_dir, corpus_file, tmp_path, capfd
):
    root, export = tmp_path / "run", tmp_path / "run" / "export"
    checkpoint = json.dumps(
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"save_last": True, "dirpath": str(root / "ckpt")},
        }
    )
    base = [*tiny_fit_args(tiny_model_dir, corpus_file, root), f"--trainer.callbacks+={checkpoint}"]
    code, printed = run(["fit", *base, segmenter(endpoint_secret=MARKED), "--trainer.max_steps=3"], capfd)
    assert code == 0, printed[-3000:]
    assert secrets_in(export) == [] and KEY not in printed and MARKED not in printed
    card = (export / "README.md").read_text(encoding="utf-8")
    (row,) = [line for line in card.splitlines() if line.startswith("- segmenter: ")]
    assert row.startswith(
        f"- segmenter: `{__name__}.CloudSegmenter(api_key={WITHHELD}, endpoint_secret={WITHHELD}"
    )
    assert row.endswith("max_chars=1, reject=False)` (secret arguments withheld)"), row
    assert f"api_key: {WITHHELD}" in (export / "training_config.yaml").read_text(encoding="utf-8")

    # The key rotated: the same run goes on (the words do not depend on it).
    longer = [*base, segmenter(ROTATED, endpoint_secret=MARKED), "--trainer.max_steps=5", "--ckpt_path=last"]
    code, printed = run(["fit", *longer, "--export.overwrite=true"], capfd)
    assert code == 0, printed[-3000:]
    assert secrets_in(export) == [] and not any(s in printed for s in (KEY, ROTATED, MARKED))

    # A setting of the words changed: refused, the line naming it and no secret.
    code, printed = run(
        ["fit", *base, segmenter(ROTATED, max_chars=2), "--trainer.max_steps=7", "--ckpt_path=last"], capfd
    )
    assert code == 2 and "data.segmentation.segmenter.init_args.max_chars: 1 -> 2" in printed, printed[-2000:]
    assert not any(s in printed for s in (KEY, ROTATED, MARKED))

    # export from the checkpoint: the card and config it writes withhold them too.
    code, printed = run(
        ["export", f"--ckpt_path={root / 'ckpt' / 'last.ckpt'}", f"--output_dir={tmp_path / 'again'}"], capfd
    )
    assert code == 0, printed[-2000:]
    assert secrets_in(tmp_path / "again") == [] and not any(s in printed for s in (KEY, ROTATED, MARKED))


def test_a_segmenter_that_fails_is_one_line_without_its_key(tiny_model_dir, corpus_file, tmp_path, capfd):
    args = tiny_fit_args(tiny_model_dir, corpus_file, tmp_path / "run", segmenter(reject=True))
    code, printed = run(["fit", *args], capfd)
    assert code == 2
    (line,) = [line for line in printed.splitlines() if line.startswith("mlm_adapt: error:")]
    assert f"CloudSegmenter(**{{'api_key': '{WITHHELD}', 'endpoint_secret': '{WITHHELD}'" in line, line
    assert "failed: PermissionError: the service rejected the key" in line
    assert KEY not in printed
