"""The options every export shares (``export.*`` in a fit config, ``--*`` of ``python -m mlm_adapt export``)
and the Hub upload they configure; light (no torch, no transformers), so that ``export --help`` and a bad
``--repo_id`` answer at once."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from huggingface_hub import HfApi, constants, get_token
from huggingface_hub.errors import HfHubHTTPError, HFValidationError, OfflineModeIsEnabled
from huggingface_hub.utils import validate_repo_id

from mlm_adapt.errors import MLMAdaptError, exception_line
from mlm_adapt.guard.outputs import MARKER

# Connection failures surface as the HTTP client's own errors (httpx or httpx2, depending on the
# huggingface_hub version); HfHubHTTPError derives from that client's HTTPError, so take it from there.
_HTTP_ERRORS = tuple(c for c in HfHubHTTPError.__mro__[1:] if c.__name__ == "HTTPError")

COMMIT_MESSAGE = "Upload adapted masked-LM (mlm_adapt)"


@dataclass(kw_only=True, eq=False)
class ExportOptions:
    """Options of every export (``export.*`` in a fit config, ``--*`` of ``python -m mlm_adapt export``).

    Args:
        overwrite: Replace an earlier export in the output directory (recognised by its
            .mlm_adapt-export.json marker), atomically. A directory holding anything else, the current
            directory, a run directory and a directory holding an input are refused, overwrite or not.
        license: License identifier in the model card.
        tags: Hub tags in the model card; default: the model's family (bert, xlm-roberta, ...), fill-mask,
            chinese, domain-adaptation, mlm_adapt and the masking scheme's (whole-word-masking unless
            data.masking.scheme is token).
        push_to_hub: Upload the directory to the Hub (token from HF_TOKEN or `hf auth login`, never printed).
        repo_id: Hub repository NAME or ORG/NAME; required with push_to_hub.
        private: Create the Hub repository as private.
        revision: Hub branch to commit to (created from main if missing); default main. {step} in it
            stands for the exported weights' global step: with step-{step}, fit also exports each
            checkpoint a ModelCheckpoint saves and pushes it to its own branch (step-2000, ...) as it
            is saved, loadable by from_pretrained(repo_id, revision="step-2000"), and the export at the
            end of fit goes to main.
        merge_alpha: Export the weights merged back toward the base model the run started from,
            base + merge_alpha * (adapted - base): 1 is the adapted model, 0 the base (docs/export.md).
        merge_budget: Export the merge with the largest alpha whose general validation perplexity rises at
            most this fraction over the base's (0.2: +20%) with 95% confidence, chosen on half the general
            set's blocks and reported on the other half; needs a general validation set (the second of
            data.validation_files).
    """

    # How the options are spelled on the command line, for error messages (``export.`` in fit configs).
    option_prefix: ClassVar[str] = "--"

    overwrite: bool = False
    license: str = "apache-2.0"
    tags: list[str] | None = None
    push_to_hub: bool = False
    repo_id: str | None = None
    private: bool = False
    revision: str | None = None
    merge_alpha: float | None = None
    merge_budget: float | None = None

    def __post_init__(self) -> None:
        if self.push_to_hub and not self.repo_id:
            raise MLMAdaptError(
                f"{self.option_prefix}repo_id is required with push_to_hub; give NAME or ORG/NAME"
            )
        if self.repo_id is not None:
            check_repo_id(self.repo_id, f"{self.option_prefix}repo_id")
        self.tags = list(self.tags) if self.tags is not None else None
        self.branch(0)  # a bad {field} is refused now, not after training
        self.check_merge()

    def branch(self, step: int | None) -> str | None:
        """The Hub branch of the weights of global step ``step``: ``revision`` with ``{step}`` filled in."""
        if self.revision is None or "{" not in self.revision:
            return self.revision
        try:
            return self.revision.format(step=step)
        except (KeyError, IndexError, ValueError):
            raise MLMAdaptError(
                f"{self.option_prefix}revision={self.revision!r}: the one field a branch name may hold is "
                "{step}, e.g. step-{step}"
            ) from None

    @property
    def pushes_checkpoints(self) -> bool:
        """Whether each checkpoint gets a branch of its own: ``push_to_hub``, ``{step}`` in ``revision``."""
        return self.push_to_hub and self.branch(1) != self.branch(2)

    def check_merge(self) -> None:
        """Refuses a merge weight outside [0, 1], a budget that is no rise > 0, and both at once."""
        prefix, alpha, budget = self.option_prefix, self.merge_alpha, self.merge_budget
        if alpha is not None and budget is not None:
            raise MLMAdaptError(
                f"{prefix}merge_alpha and {prefix}merge_budget both given; give alpha to merge with it, "
                "or the budget to choose alpha"
            )
        if alpha is not None and not (isinstance(alpha, int | float) and 0 <= alpha <= 1):
            raise MLMAdaptError(f"{prefix}merge_alpha={alpha} must be in [0, 1] (1: the adapted model)")
        if budget is not None and not (isinstance(budget, int | float) and 0 < budget < math.inf):
            raise MLMAdaptError(
                f"{prefix}merge_budget={budget} must be a finite number > 0, e.g. 0.2 (+20% perplexity)"
            )

    @property
    def merges(self) -> bool:
        """Whether the export is merged toward the base (``merge_alpha`` or ``merge_budget`` given)."""
        return self.merge_alpha is not None or self.merge_budget is not None

    def card_fields(self, branch: str | None) -> dict[str, Any]:
        """What the model card states of these options (``ExportInfo``'s license, tags, Hub repo) and of
        the ``branch`` the export goes to."""
        return {
            "license": self.license,
            "tags": list(self.tags) if self.tags is not None else None,
            "repo_id": self.repo_id if self.push_to_hub else None,
            "revision": branch if self.push_to_hub else None,
        }

    def push(
        self, folder: str | Path, progress: Any, branch: str | None, kept: str | None = None
    ) -> str | None:
        """Uploads ``folder`` to ``branch`` with :func:`push_folder` if ``push_to_hub``; the commit's URL,
        else ``None`` (``progress``: a :class:`mlm_adapt.data.progress.Progress`, from the layer above)."""
        if not self.push_to_hub:
            return None
        where = f"{self.repo_id}@{branch}" if branch else self.repo_id
        with progress.phase(f"uploading to the Hub ({where})"):
            return push_folder(folder, self.repo_id, self.private, branch, kept)


def check_repo_id(repo_id: str, key: str = "repo_id") -> None:
    """Refuses a Hub repository id the Hub would refuse after training (``a/b/c``, ``../x``, spaces)."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise MLMAdaptError(
            f"{key}={repo_id!r} is no Hub repository id; give NAME or ORG/NAME (letters, digits, '-', '_', "
            "'.'; not starting or ending with '-' or '.'; at most 96 characters)"
        ) from None


def check_hub_access(repo_id: str | None, key: str = "--repo_id") -> None:
    """Fails before any work when a push could not happen: no repo id, offline mode, no token (whose value
    is never returned, printed or logged)."""
    if not repo_id:
        raise MLMAdaptError(f"{key} is required with push_to_hub; give the Hub repo as NAME or ORG/NAME")
    if constants.is_offline_mode():
        raise MLMAdaptError("push_to_hub: HF_HUB_OFFLINE is set; unset it to upload, or drop push_to_hub")
    if get_token() is None:
        raise MLMAdaptError(
            "push_to_hub: no Hugging Face token; set HF_TOKEN or run `hf auth login` (write access needed)"
        )


def push_folder(
    folder: str | Path,
    repo_id: str,
    private: bool = False,
    revision: str | None = None,
    kept: str | None = None,
) -> str:
    """Uploads ``folder`` as one commit to the model repo ``repo_id`` (created if needed, ``private`` then),
    on the branch ``revision`` (created from ``main`` if missing); returns the commit's URL. Network and
    permission failures become one line that ends in ``kept`` (default: the local export is kept)."""
    check_hub_access(repo_id)
    api = HfApi()
    try:
        repo_url = api.create_repo(repo_id, private=private, repo_type="model", exist_ok=True)
        if revision:
            api.create_branch(repo_url.repo_id, branch=revision, repo_type="model", exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo_url.repo_id,
            folder_path=str(folder),
            repo_type="model",
            revision=revision,
            commit_message=COMMIT_MESSAGE,
            ignore_patterns=[MARKER],  # local bookkeeping of overwrite, not part of the model
        )
    # OSError: offline mode (a ConnectionError) and hf_xet's failures; RuntimeError: an LFS upload's.
    except (*_HTTP_ERRORS, OSError, RuntimeError) as exc:
        raise MLMAdaptError(
            f"push_to_hub: {push_failure(exc, repo_id)}; {kept or f'the local export is kept in {folder}'}"
        ) from None
    return str(getattr(commit, "commit_url", commit))


def push_failure(exc: BaseException, repo_id: str) -> str:
    """What stopped a push, in words: offline mode, the token (HTTP 401: not accepted; 403: no write access
    to ``repo_id``), another answer of the Hub, the Xet storage, or no connection. An LFS upload's error
    comes wrapped in a ``RuntimeError``: its cause says what happened."""
    while isinstance(exc, RuntimeError) and exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, OfflineModeIsEnabled):
        return "HF_HUB_OFFLINE is set, nothing uploaded"
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        if status == 401:
            return (
                "the Hub does not accept the token (HTTP 401); set HF_TOKEN or `hf auth login` to a valid one"
            )
        if status == 403:
            return (
                f"the token may not write to {repo_id!r} (HTTP 403); use a token with write access to it, "
                "or a repo_id in a namespace you can write to"
            )
        return f"the Hub refused the upload to {repo_id!r} (HTTP {status}): {exception_line(exc)}"
    if isinstance(exc, _HTTP_ERRORS):  # connection refused, DNS failure, timeouts
        return f"cannot reach the Hub at {constants.ENDPOINT} ({type(exc).__name__})"
    if isinstance(exc, OSError) and not constants.HF_HUB_DISABLE_XET:
        # Not the HTTP client's: hf_xet's, which reports every failure of the Xet protocol as an OSError
        # (ConnectionError), the Hub's own answers included.
        return (
            f"the upload to the Hub's Xet storage failed ({exception_line(exc)}); "
            "HF_HUB_DISABLE_XET=1 uploads by LFS instead"
        )
    return f"the upload to {repo_id!r} failed: {exception_line(exc)}"
