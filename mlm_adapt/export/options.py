"""What an export writes besides the weights, and where it uploads: shared by the callback and the command."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.export.card import DEFAULT_TAGS


@dataclass(kw_only=True, eq=False)
class ExportOptions:
    """Options of every export (``export.*`` in a fit config, ``--*`` of ``python -m mlm_adapt export``).

    Args:
        overwrite: Replace an earlier export in the output directory (recognised by its
            .mlm_adapt-export.json marker), atomically. A directory holding anything else, the current
            directory, a run directory and a directory holding an input are refused, overwrite or not.
        verify: Reload the export and compare its logits with the trained weights on a probe batch.
        license: License identifier in the model card.
        tags: Hub tags in the model card (default: bert, fill-mask, chinese, whole-word-masking, ...).
        push_to_hub: Upload the directory to the Hub (token from HF_TOKEN or `hf auth login`, never printed).
        repo_id: Hub repository NAME or ORG/NAME; required with push_to_hub.
        private: Create the Hub repository as private.
        revision: Hub branch to commit to (created if missing); default main.
        commit_message: Hub commit message.
    """

    # How the options are spelled on the command line, for error messages (``export.`` in fit configs).
    option_prefix: ClassVar[str] = "--"

    overwrite: bool = False
    verify: bool = True
    license: str = "apache-2.0"
    tags: list[str] = field(default_factory=lambda: list(DEFAULT_TAGS))
    push_to_hub: bool = False
    repo_id: str | None = None
    private: bool = False
    revision: str | None = None
    commit_message: str = "Upload adapted masked-LM (mlm_adapt)"

    def __post_init__(self) -> None:
        if self.push_to_hub and not self.repo_id:
            raise MLMAdaptError(
                f"{self.option_prefix}repo_id is required with push_to_hub; give NAME or ORG/NAME"
            )
        if self.repo_id is not None:
            check_repo_id(self.repo_id, f"{self.option_prefix}repo_id")
        self.tags = list(self.tags) if self.tags is not None else list(DEFAULT_TAGS)


def check_repo_id(repo_id: str, key: str = "repo_id") -> None:
    """Refuses a Hub repository id the Hub would refuse after training (``a/b/c``, ``../x``, spaces)."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise MLMAdaptError(
            f"{key}={repo_id!r} is no Hub repository id; give NAME or ORG/NAME (letters, digits, '-', '_', "
            "'.'; not starting or ending with '-' or '.'; at most 96 characters)"
        ) from None
