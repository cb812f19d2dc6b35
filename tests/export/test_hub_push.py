"""The Hub push against a Hub server over HTTP (``tests/hub_server.py`` on 127.0.0.1: no network), through
the real command line in fresh interpreters (``HF_ENDPOINT``, ``HF_TOKEN``, a fresh ``HF_HOME``): what
``fit`` and ``export`` push arrives file for file and loads by revision with the export's logits; a
checkpoint per branch; and each failure (token, permission, no server, Xet) is one line that keeps the
local export and prints no token."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO, tiny_fit_args
from hub_server import READ_TOKEN, WRITE_TOKEN

REPO_ID = "alice/adapted"
CHECKPOINTS = (
    '{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": '
    '{"every_n_train_steps": 3, "save_top_k": -1, "save_last": true, "filename": "{step}", "dirpath": "%s"}}'
)
# Pulls REPO at REVISION back (snapshot_download, from_pretrained) and compares it with the local export
# LOCAL: the sha256 of every file and the largest logit difference on a probe with masks, as JSON.
PULL = """
import hashlib, json, sys
from pathlib import Path
import torch
from huggingface_hub import snapshot_download
from transformers import AutoModelForMaskedLM, AutoTokenizer

repo, revision, local = sys.argv[1], sys.argv[2], Path(sys.argv[3])
pulled = Path(snapshot_download(repo, revision=revision))
def digests(root):
    files = [p for p in sorted(root.rglob("*")) if p.is_file() and not p.name.startswith(".")]
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
tokenizer = AutoTokenizer.from_pretrained(local)
batch = tokenizer(["北京[MASK][MASK]你！", "这本书的内容很好。"], padding=True, return_tensors="pt")
with torch.no_grad():
    hub = AutoModelForMaskedLM.from_pretrained(repo, revision=revision).eval()(**batch).logits
    mine = AutoModelForMaskedLM.from_pretrained(local).eval()(**batch).logits
card = (pulled / "README.md").read_text(encoding="utf-8")
print(json.dumps({"local": digests(local), "pulled": digests(pulled), "diff": (hub - mine).abs().max().item(),
                  "card": card}))
"""


def call(hub: str, method: str, path: str, token: str | None = None, body: dict | None = None):
    """``method path`` on the Hub server at ``hub``: (status, headers, JSON body)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{hub}{path}", data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request) as response:  # noqa: S310 - the local test server
            return response.status, response.headers, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, json.loads(exc.read() or b"null")


@pytest.fixture(scope="module")
def hub():
    """The Hub server's URL; the server ends with the module (its standard input closes)."""
    server = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "hub_server.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    url = server.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), url
    yield url
    server.stdin.close()
    server.wait(timeout=30)


def hub_env(url: str, home: Path, token: str | None = WRITE_TOKEN, xet: bool = False) -> dict[str, str]:
    """The environment of a user of the Hub at ``url``: the token, a fresh ``HF_HOME``, LFS unless ``xet``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_HUB_") and k != "HF_TOKEN"}
    env |= {"HF_ENDPOINT": url, "HF_HOME": str(home), "PYTHONPATH": str(REPO)}
    if token is not None:
        env["HF_TOKEN"] = token
    if not xet:
        env["HF_HUB_DISABLE_XET"] = "1"
    return env


def fresh(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """``python ARGS`` in a fresh interpreter: huggingface_hub reads HF_ENDPOINT when it is imported."""
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def pull(url: str, home: Path, revision: str, local: Path) -> dict:
    result = fresh(["-c", PULL, REPO_ID, revision, str(local)], hub_env(url, home), home.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def hub_run(hub, tmp_path_factory, tiny_model_dir, review_texts) -> tuple[Path, subprocess.CompletedProcess]:
    """A 6-step fit that saves a checkpoint every 3 steps and pushes each to ``step-{step}``, the final
    export to main, of a private repo."""
    root = tmp_path_factory.mktemp("hub_run")
    corpus = root / "reviews.txt"
    corpus.write_text("\n".join(review_texts) + "\n", encoding="utf-8")
    args = tiny_fit_args(
        tiny_model_dir, corpus, root,
        "--trainer.val_check_interval=3",
        f"--trainer.callbacks+={CHECKPOINTS % (root / 'checkpoints')}",
        "--export.checkpoint=last", "--export.push_to_hub=true", f"--export.repo_id={REPO_ID}",
        "--export.revision=step-{step}", "--export.private=true",
    )  # fmt: skip
    result = fresh(["-m", "mlm_adapt", "fit", *args], hub_env(hub, root / "hf_home"), root)
    assert result.returncode == 0, result.stderr[-3000:]
    return root, result


def pushed_commits(output: str) -> list[str]:
    """The commit URLs of the ``pushed ... to URL`` lines of a command's output."""
    return [line.rsplit(" to ", 1)[-1] for line in output.splitlines() if "pushed" in line and " to " in line]


def test_fit_pushes_the_export_to_main_and_each_checkpoint_to_its_branch(hub, hub_run, tmp_path):
    root, result = hub_run
    lines = [line for line in result.stdout.splitlines() + result.stderr.splitlines() if "pushed" in line]
    assert [line.split(" to ")[0] for line in lines] == [
        "mlm_adapt export: pushed step=3.ckpt (step 3)",
        "mlm_adapt export: pushed step=6.ckpt (step 6)",
        "mlm_adapt export: pushed",
    ], lines
    assert WRITE_TOKEN not in result.stdout + result.stderr
    assert not list(root.glob(".mlm_adapt-push-*"))  # the exports made for the pushes are gone
    assert call(hub, "GET", f"/api/models/{REPO_ID}", WRITE_TOKEN)[2]["private"] is True
    assert call(hub, "GET", f"/api/models/{REPO_ID}")[0] == 404  # hidden from anyone else

    main = pull(hub, tmp_path / "home_main", "main", root / "export")
    assert main["pulled"] == main["local"] and "model.safetensors" in main["pulled"]
    assert main["diff"] == 0
    assert f'pipeline("fill-mask", model="{REPO_ID}")' in main["card"]
    assert str(root) not in main["card"] and "last.ckpt" not in main["card"]


def test_export_pushes_a_checkpoint_to_a_branch_that_loads_it(hub, hub_run, tmp_path):
    """``export --revision step-3`` of the checkpoint of step 3: the branch holds its files, loads with its
    logits and says so in its card, which names no path of this machine. The fit pushed the same export
    to that branch already (with --export.revision step-{step}) and pushing it again makes no commit."""
    root, fit = hub_run
    local = tmp_path / "step3"
    result = fresh(
        ["-m", "mlm_adapt", "export", "--ckpt_path", str(root / "checkpoints" / "step=3.ckpt"),
         "--output_dir", str(local), "--push_to_hub", "--repo_id", REPO_ID, "--revision", "step-3"],
        hub_env(hub, tmp_path / "home_export"), tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    branch = pull(hub, tmp_path / "home_branch", "step-3", local)
    assert branch["pulled"] == branch["local"] and "model.safetensors" in branch["pulled"]
    assert branch["diff"] == 0
    card = branch["card"]
    assert f'pipeline("fill-mask", model="{REPO_ID}", revision="step-3")' in card
    assert f"This is the `step-3` branch of `{REPO_ID}`: the weights of step 3." in card
    assert "- exported weights: `checkpoint step=3.ckpt (step 3)`" in card
    assert str(root) not in card and str(tmp_path) not in card
    # Unchanged: the commit is the branch's head, the one the fit's push of step 3 made.
    assert pushed_commits(result.stdout) == pushed_commits(fit.stdout + fit.stderr)[:1]


def test_a_fit_whose_pushes_fail_trains_on_and_ends_in_one_line(hub, hub_run, tiny_model_dir, tmp_path):
    """A read-only token: each checkpoint's push is one warning that names the command that pushes it later
    and training goes on; the final push ends the fit in one line; the checkpoints and the export stay."""
    corpus = tmp_path / "reviews.txt"
    corpus.write_text((hub_run[0] / "reviews.txt").read_text(encoding="utf-8"), encoding="utf-8")
    args = tiny_fit_args(
        tiny_model_dir, corpus, tmp_path,
        "--trainer.val_check_interval=3",
        f"--trainer.callbacks+={CHECKPOINTS % (tmp_path / 'checkpoints')}",
        "--export.checkpoint=last", "--export.push_to_hub=true", "--export.repo_id=alice/read-only",
        "--export.revision=step-{step}",
    )  # fmt: skip
    result = fresh(
        ["-m", "mlm_adapt", "fit", *args], hub_env(hub, tmp_path / "hf_home", READ_TOKEN), tmp_path
    )
    denied = (
        "push_to_hub: the token may not write to 'alice/read-only' (HTTP 403); use a token with write access "
        "to it, or a repo_id in a namespace you can write to; "
    )
    mark = "mlm_adapt export: push_to_hub:"
    warned = [line[line.index(mark) :] for line in result.stderr.splitlines() if mark in line]
    assert result.returncode == 2 and len(warned) == 2, result.stderr[-3000:]
    for step, line in zip((3, 6), warned, strict=True):
        path = tmp_path / "checkpoints" / f"step={step}.ckpt"
        later = f"--output_dir DIR --push_to_hub --repo_id alice/read-only --revision step-{step}"
        assert line == (
            f"mlm_adapt export: {denied}training goes on, {path} is kept: "
            f"`python -m mlm_adapt export --ckpt_path {path} {later}` pushes it"
        )
    assert result.stderr.splitlines()[-1] == (
        f"mlm_adapt: error: {denied}the local export is kept in {tmp_path / 'export'}"
    )
    assert (tmp_path / "export" / "model.safetensors").is_file() and not list(
        tmp_path.glob(".mlm_adapt-push-*")
    )
    assert READ_TOKEN not in result.stdout + result.stderr


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


FAILURES = {
    "wrong token": (
        "hf_not_a_token_of_this_hub", False, None, REPO_ID,
        "push_to_hub: the Hub does not accept the token (HTTP 401); set HF_TOKEN or `hf auth login` to a "
        "valid one",
    ),
    "another namespace": (
        WRITE_TOKEN, False, None, "bob/adapted",
        "push_to_hub: the token may not write to 'bob/adapted' (HTTP 403); use a token with write access "
        "to it, or a repo_id in a namespace you can write to",
    ),
    "stopped server": (
        WRITE_TOKEN, False, "closed", REPO_ID, "push_to_hub: cannot reach the Hub at {url} (ConnectError)"
    ),
    "xet failure": (
        WRITE_TOKEN, True, None, "alice/xet",
        "push_to_hub: the upload to the Hub's Xet storage failed (Server error: Request error: HTTP status "
        "server error (501 Not Implemented), domain: {url}/api/models/alice/xet/xet-write-token/step-3); "
        "HF_HUB_DISABLE_XET=1 uploads by LFS instead",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(FAILURES))
def test_a_failed_push_is_one_line_that_says_why_and_keeps_the_export(case, hub, hub_run, tmp_path):
    token, xet, server, repo_id, reason = FAILURES[case]
    url = _closed_port_url() if server == "closed" else hub
    output = tmp_path / "export"
    result = fresh(
        ["-m", "mlm_adapt", "export", "--ckpt_path", str(hub_run[0] / "checkpoints" / "step=3.ckpt"),
         "--output_dir", str(output), "--push_to_hub", "--repo_id", repo_id, "--revision", "step-{step}"],
        hub_env(url, tmp_path / "home", token, xet), tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    error = [line for line in result.stderr.splitlines() if line.startswith("mlm_adapt: error:")]
    expected = f"mlm_adapt: error: {reason.format(url=url)}; the local export is kept in {output}"
    assert error == [expected], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert token not in result.stdout + result.stderr
    assert {"model.safetensors", "config.json", "README.md"} <= {p.name for p in output.iterdir()}


def test_the_hub_server_answers_as_the_hub_does(hub):
    """What the tests above rely on of the server itself: a second create is 409 with the repo's URL, a
    private repo is RepoNotFound to anyone but its owner, an unknown token is 401."""

    create = {"name": "secret", "organization": None, "visibility": "private", "type": "model"}
    assert call(hub, "POST", "/api/repos/create", WRITE_TOKEN, create)[0] == 200
    status, _, body = call(hub, "POST", "/api/repos/create", WRITE_TOKEN, create)
    assert (status, body["url"]) == (409, f"{hub}/alice/secret")
    assert call(hub, "GET", "/api/models/alice/secret", WRITE_TOKEN)[2]["private"] is True
    status, headers, _ = call(hub, "GET", "/api/models/alice/secret")  # anonymous
    assert (status, headers["X-Error-Code"]) == (404, "RepoNotFound")
    assert call(hub, "GET", "/api/models/alice/secret", "hf_unknown")[0] == 401
    assert call(hub, "GET", "/api/models/alice/secret", READ_TOKEN)[0] == 200  # the owner's, read-only
