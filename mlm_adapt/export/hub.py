"""Uploading an exported model directory to the Hugging Face Hub (``create_repo`` + ``upload_folder``)."""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import HfApi, constants, get_token
from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

from mlm_adapt.errors import MLMAdaptError, exception_line
from mlm_adapt.guard.outputs import MARKER

# Connection failures surface as the HTTP client's own errors (httpx or httpx2, depending on the
# huggingface_hub version); HfHubHTTPError derives from that client's HTTPError, so take it from there.
_CLIENT_ERRORS = tuple(c for c in HfHubHTTPError.__mro__[1:] if c.__name__ == "HTTPError") + (OSError,)


def check_hub_access(repo_id: str | None, key: str = "--repo_id") -> None:
    """Fails before any work when a push could not happen: no repo id, offline mode, no token.

    The token itself is never returned, printed or logged; only its presence is checked.
    """
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
    commit_message: str = "Upload adapted masked-LM (mlm_adapt)",
) -> str:
    """Creates the model repo if needed (and the branch ``revision``) and uploads ``folder`` as one commit.

    Authentication is ``huggingface_hub``'s own: ``HF_TOKEN`` or the stored login. Network and permission
    failures become a one-line :class:`MLMAdaptError` that says the local export is kept.

    Args:
        folder: The exported model directory.
        repo_id: ``NAME`` or ``ORG/NAME`` of the model repository.
        private: Create the repository as private (an existing repository keeps its visibility).
        revision: Branch to commit to (created from ``main`` if missing); default ``main``.
        commit_message: The commit message.

    Returns:
        The URL of the commit.
    """
    check_hub_access(repo_id)
    kept = f"the local export is kept in {folder}"
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
            commit_message=commit_message,
            ignore_patterns=[MARKER],  # local bookkeeping of overwrite, not part of the model
        )
    except OfflineModeIsEnabled:
        raise MLMAdaptError(f"push_to_hub: HF_HUB_OFFLINE is set, nothing uploaded; {kept}") from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403):
            reason = (
                f"the token may not write to {repo_id!r} (HTTP {status}); check HF_TOKEN / `hf auth login`"
            )
        else:
            reason = f"the Hub refused the upload to {repo_id!r} (HTTP {status}): {exception_line(exc)}"
        raise MLMAdaptError(f"push_to_hub: {reason}; {kept}") from None
    except _CLIENT_ERRORS as exc:  # connection refused, DNS failure, timeouts
        raise MLMAdaptError(f"push_to_hub: cannot reach the Hub ({type(exc).__name__}); {kept}") from None
    return str(getattr(commit, "commit_url", commit))
