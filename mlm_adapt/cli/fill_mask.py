"""``python -m mlm_adapt fill-mask``: top-k tokens per ``[MASK]`` and whole-word fillings of mask runs.

torch, transformers and the model's loading are imported when the command runs: ``--help`` and a refused
option answer at once."""

import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from jsonargparse import auto_cli

from mlm_adapt.errors import MLMAdaptError, check_checkpoint_path, check_model_path

# Annotations only, quoted: jsonargparse evaluates postponed annotations (and so runs a TYPE_CHECKING block)
# of the module whose function it reads, which would import them with --help.
if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# The attention a ``[MASK]`` gets (training always attends it), with the column label each prints under.
MODES = {"attend": "[MASK] attended", "exclude": "[MASK] not attended"}


@dataclass
class MaskPrediction:
    """Top-k tokens for one ``[MASK]``: its token position and ``(token, probability)`` pairs, best first."""

    position: int
    candidates: list[tuple[str, float]]


@dataclass
class WordFilling:
    """The best filling of a run of consecutive masks (mask indices ``first``..``last``, 0-based)."""

    first: int
    last: int
    word: str
    text: str
    probability: float


def load_for_inference(model: str) -> "tuple[PreTrainedModel, PreTrainedTokenizerBase]":
    """Loads a Hugging Face directory (or Hub name) or a Lightning checkpoint (file or FSDP shard dir)."""
    from mlm_adapt.guard.loads import is_sharded_checkpoint, pretrained_tokenizer  # noqa: PLC0415
    from mlm_adapt.model.checkpoints import load_checkpoint, module_from_checkpoint, tokenizer_for  # noqa: PLC0415
    from mlm_adapt.model.loading import pretrained_masked_lm  # noqa: PLC0415

    path = Path(model)
    if path.suffix == ".ckpt" or is_sharded_checkpoint(path) or path.is_file():
        checkpoint = load_checkpoint(path, key="--model")
        module = module_from_checkpoint(checkpoint, key="--model")
        return module.model.eval(), tokenizer_for(checkpoint)
    # The tokenizer first: it is the cheaper of the two to find missing.
    tokenizer = pretrained_tokenizer(model, "--model")
    lm, _ = pretrained_masked_lm(model, "--model")
    return lm.eval(), tokenizer


def _probs(model: "PreTrainedModel", input_ids: "torch.Tensor", banned: list[int], hidden: int | None):
    import torch  # noqa: PLC0415 - loaded with the model (see the module docstring)

    # ``hidden``: a token (the mask) excluded from attention, else every position is attended.
    attention_mask = torch.ones_like(input_ids) if hidden is None else (input_ids != hidden).long()
    with torch.no_grad():
        logits = model(input_ids=input_ids[None], attention_mask=attention_mask[None]).logits[0].float()
    probs = logits.softmax(-1)  # over the whole vocabulary, as pipeline("fill-mask") reports them
    probs[:, banned] = 0.0  # special tokens are never shown nor chosen as a filling
    return probs


def predict(
    model: "PreTrainedModel",
    tokenizer: "PreTrainedTokenizerBase",
    text: str,
    top_k: int = 5,
    mask_attention: Literal["attend", "exclude"] = "attend",
) -> tuple[list[MaskPrediction], list[WordFilling]]:
    """Top-k tokens per mask of ``text``, and for each run of consecutive masks its best filling (special
    tokens excluded); with ``mask_attention="exclude"``, unfilled masks get ``attention_mask`` 0.

    A run is filled greedily (as mask-predict decoding does): its most confident mask is fixed first, the
    model rerun with it filled in, and so on; the filling's probability is the product of those chosen.
    """
    from mlm_adapt.model.loading import position_limit  # noqa: PLC0415 - loaded with the model
    from mlm_adapt.text.tokenizer import join_pieces, piece_text  # noqa: PLC0415

    if mask_attention not in MODES:
        raise ValueError(f"mask_attention={mask_attention!r}: use one of {', '.join(MODES)}")
    # verbose=False: the length is checked here, against what the model can index, in one line.
    encoded = tokenizer(text, return_tensors="pt", verbose=False)
    input_ids = encoded["input_ids"][0].to(next(model.parameters()).device)
    limit, found = position_limit(model)
    if limit is not None and len(input_ids) > limit:
        raise MLMAdaptError(
            f"TEXT is {len(input_ids)} tokens ([CLS]/[SEP] included); the model takes at most {limit} "
            f"({found}): shorten it to the sentence around the masks"
        )
    positions = (input_ids == tokenizer.mask_token_id).nonzero().flatten().tolist()
    if not positions:
        raise MLMAdaptError(
            f"TEXT has no {tokenizer.mask_token}; write e.g. 北京{tokenizer.mask_token * 2}你！"
        )
    banned = sorted(set(tokenizer.all_special_ids))
    hidden = tokenizer.mask_token_id if mask_attention == "exclude" else None
    probs = _probs(model, input_ids, banned, hidden)
    predictions = []
    for pos in positions:
        values, indices = probs[pos].topk(min(top_k, probs.shape[-1]))
        tokens = [piece_text(tokenizer, i) for i in indices.tolist()]
        predictions.append(MaskPrediction(pos, list(zip(tokens, values.tolist(), strict=True))))
    fillings = []
    runs: list[list[int]] = []
    for pos in positions:
        if runs and runs[-1][-1] == pos - 1:
            runs[-1].append(pos)
        else:
            runs.append([pos])
    for run in runs:
        ids, remaining, probability = input_ids.clone(), list(run), 1.0
        step_probs = probs
        while remaining:
            best = max(remaining, key=lambda p: step_probs[p].max().item())
            value, token = step_probs[best].max(-1)
            ids[best], probability = token, probability * value.item()
            remaining.remove(best)
            if remaining:
                step_probs = _probs(model, ids, banned, hidden)
        filled_ids = ids.tolist()
        # Decoded, not joined piece by piece: byte-level pieces of one character print as that character.
        word = join_pieces(tokenizer, filled_ids[run[0] : run[-1] + 1])
        # The text with this run filled in (other masks stay masks), without [CLS]/[SEP] (or <s>/</s>).
        kept = [i for i in filled_ids if i == tokenizer.mask_token_id or i not in banned]
        filled = join_pieces(tokenizer, kept)
        fillings.append(
            WordFilling(positions.index(run[0]), positions.index(run[-1]), word, filled, probability)
        )
    return predictions, fillings


def _p(probability: float) -> str:
    return f"{probability:.4f}" if probability >= 1e-3 else f"{probability:.2e}"


def _pad(text: str, width: int) -> str:
    """``text`` padded to ``width`` columns (wide CJK characters take two)."""
    return text + " " * max(
        width - sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text), 0
    )


def render(
    text: str, results: dict[str, tuple[list[MaskPrediction], list[WordFilling]]], column: int = 26
) -> str:
    """Plain-text report: one block per mask (rank, token, probability), then the whole-word fillings; the
    modes (``attend``, ``exclude``) side by side."""
    modes = list(results)

    def row(label: str, cells: Iterable[str]) -> str:
        return (_pad(label, 14) + "".join(_pad(cell, column) for cell in cells)).rstrip()

    lines = [f"text: {text}", "", row("", (MODES[m] for m in modes))]
    for i, prediction in enumerate(results[modes[0]][0]):
        for rank in range(len(prediction.candidates)):
            label = f"mask {i + 1} (#{prediction.position})" if rank == 0 else ""
            cells = (results[m][0][i].candidates[rank] for m in modes)
            lines.append(row(label, (f"{rank + 1}. {token} {_p(prob)}" for token, prob in cells)))
    lines += ["", "best whole-word filling per run of masks (greedy, most confident mask first):"]
    for j, run in enumerate(results[modes[0]][1]):
        span = f"masks {run.first + 1}-{run.last + 1}" if run.last > run.first else f"mask {run.first + 1}"
        fillings = (results[m][1][j] for m in modes)
        lines.append(row(span, (f"{f.word} p={_p(f.probability)}" for f in fillings)))
    lines += [f"{MODES[mode]}: {' / '.join(f.text for f in results[mode][1])}" for mode in modes]
    return "\n".join(lines)


def fill_mask(
    text: str, *, model: str, top_k: int = 5, mask_attention: Literal["attend", "exclude"] = "attend"
) -> None:
    """Prints the top-k tokens per [MASK] and the best whole-word filling of each run of consecutive masks.

    Args:
        text: Text with the tokenizer's mask token, e.g. "北京[MASK][MASK]你！".
        model: Exported Hugging Face directory (or Hub name), or a Lightning checkpoint (.ckpt file or FSDP
            sharded directory) of a fit run.
        top_k: Candidates shown per mask.
        mask_attention: "exclude": also run with the [MASK] positions excluded from attention
            (attention_mask 0) and print both side by side.
    """
    if top_k < 1:
        raise MLMAdaptError(f"--top_k={top_k} must be at least 1")
    if Path(model).suffix == ".ckpt":
        check_checkpoint_path(model, "--model")
    else:
        check_model_path(model, "--model")
    import transformers  # noqa: PLC0415 - the options are valid: now the model's stack

    transformers.logging.disable_progress_bar()
    lm, tokenizer = load_for_inference(model)
    modes = ["attend", "exclude"] if mask_attention == "exclude" else ["attend"]
    results = {mode: predict(lm, tokenizer, text, top_k, mode) for mode in modes}
    print(f"model: {model}")
    print(render(text, results))


def fill_mask_main(args: list[str]) -> None:
    """``python -m mlm_adapt fill-mask``."""
    auto_cli(fill_mask, args=args, prog="python -m mlm_adapt fill-mask", exit_on_error=False)
