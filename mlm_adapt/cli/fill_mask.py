"""``python -m mlm_adapt fill-mask``: top-k predictions per ``[MASK]`` and whole-word fillings of mask runs.

With ``--mask_attention zero`` the text is also run with the ``[MASK]`` positions excluded from attention
(``attention_mask`` 0 there) and both results are printed side by side.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import transformers
from jsonargparse import auto_cli
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.guard.loads import is_sharded_checkpoint, pretrained_tokenizer
from mlm_adapt.model.checkpoints import load_checkpoint, module_from_checkpoint, tokenizer_for
from mlm_adapt.model.loading import pretrained_masked_lm
from mlm_adapt.text.tokenizer import join_pieces, piece_text

MODES = {"none": "[MASK] attended", "zero": "[MASK] not attended"}


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


def load_for_inference(model: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Loads a Hugging Face directory (or Hub name) or a Lightning checkpoint (file or FSDP shard dir)."""
    path = Path(model)
    if path.suffix == ".ckpt" or is_sharded_checkpoint(path) or path.is_file():
        checkpoint = load_checkpoint(path, key="--model")
        module = module_from_checkpoint(checkpoint, key="--model")
        return module.model.eval(), tokenizer_for(checkpoint)
    # The tokenizer first: it is the cheaper of the two to find missing.
    tokenizer = pretrained_tokenizer(model, "--model")
    return pretrained_masked_lm(model, "--model").eval(), tokenizer


def _mask_runs(positions: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for pos in positions:
        if runs and runs[-1][-1] == pos - 1:
            runs[-1].append(pos)
        else:
            runs.append([pos])
    return runs


@torch.no_grad()
def _probs(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, banned: list[int]):
    logits = model(input_ids=input_ids[None], attention_mask=attention_mask[None]).logits[0].float()
    probs = logits.softmax(-1)  # over the whole vocabulary, as pipeline("fill-mask") reports them
    probs[:, banned] = 0.0  # special tokens are never shown nor chosen as a filling
    return probs


def predict(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    text: str,
    top_k: int = 5,
    mask_attention: Literal["none", "zero"] = "none",
) -> tuple[list[MaskPrediction], list[WordFilling]]:
    """Top-k tokens per mask, and for each run of consecutive masks its best filling.

    A run is filled greedily (the approach of mask-predict decoding): the most confident of its masks is
    fixed first, the model is rerun with it filled in, and so on; the filling's probability is the product of
    the probabilities at the times of choosing. Special tokens (``[UNK]``, ``[SEP]``, ...) are excluded.

    Args:
        model: A masked LM (eval mode).
        tokenizer: Its tokenizer.
        text: Text containing the tokenizer's mask token, e.g. ``北京[MASK][MASK]你！``.
        top_k: Candidates per mask.
        mask_attention: ``zero``: ``attention_mask`` 0 on ``[MASK]`` positions (unfilled masks are invisible).
    """
    device = next(model.parameters()).device
    encoded = tokenizer(text, return_tensors="pt")
    input_ids = encoded["input_ids"][0].to(device)
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and len(input_ids) > limit:
        raise MLMAdaptError(
            f"TEXT is {len(input_ids)} tokens ([CLS]/[SEP] included); the model takes at most {limit}: "
            "shorten it to the sentence around the masks"
        )
    positions = (input_ids == tokenizer.mask_token_id).nonzero().flatten().tolist()
    if not positions:
        raise MLMAdaptError(
            f"TEXT has no {tokenizer.mask_token}; write e.g. 北京{tokenizer.mask_token * 2}你！"
        )
    banned = sorted(set(tokenizer.all_special_ids))

    def attention(ids: torch.Tensor) -> torch.Tensor:
        mask = torch.ones_like(ids)
        if mask_attention == "zero":
            mask[ids == tokenizer.mask_token_id] = 0
        return mask

    probs = _probs(model, input_ids, attention(input_ids), banned)
    predictions = []
    for pos in positions:
        values, indices = probs[pos].topk(min(top_k, probs.shape[-1]))
        tokens = [piece_text(tokenizer, i) for i in indices.tolist()]
        predictions.append(
            MaskPrediction(pos, [(t, v) for t, v in zip(tokens, values.tolist(), strict=True)])
        )
    fillings = []
    for run in _mask_runs(positions):
        ids, remaining, probability = input_ids.clone(), list(run), 1.0
        step_probs = probs
        while remaining:
            best = max(remaining, key=lambda p: step_probs[p].max().item())
            value, token = step_probs[best].max(-1)
            ids[best], probability = token, probability * value.item()
            remaining.remove(best)
            if remaining:
                step_probs = _probs(model, ids, attention(ids), banned)
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


def _width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _pad(text: str, width: int) -> str:
    return text + " " * max(width - _width(text), 0)


def render(
    text: str, results: dict[str, tuple[list[MaskPrediction], list[WordFilling]]], column: int = 26
) -> str:
    """Plain-text report: one block per mask (rank, token, probability), then the whole-word fillings.

    With several modes (``none`` and ``zero``) their columns are printed side by side.
    """
    modes = list(results)
    lines = [f"text: {text}", ""]
    header = _pad("", 14) + "".join(_pad(MODES[m], column) for m in modes)
    lines.append(header.rstrip())
    n_masks = len(results[modes[0]][0])
    for i in range(n_masks):
        pos = results[modes[0]][0][i].position
        for rank in range(len(results[modes[0]][0][i].candidates)):
            label = f"mask {i + 1} (#{pos})" if rank == 0 else ""
            cells = []
            for mode in modes:
                token, prob = results[mode][0][i].candidates[rank]
                cells.append(_pad(f"{rank + 1}. {token} {_p(prob)}", column))
            lines.append((_pad(label, 14) + "".join(cells)).rstrip())
    lines += ["", "best whole-word filling per run of masks (greedy, most confident mask first):"]
    for j, first in enumerate(results[modes[0]][1]):
        span = (
            f"masks {first.first + 1}-{first.last + 1}"
            if first.last > first.first
            else f"mask {first.first + 1}"
        )
        cells = [_pad(f"{results[m][1][j].word} p={_p(results[m][1][j].probability)}", column) for m in modes]
        lines.append((_pad(span, 14) + "".join(cells)).rstrip())
    for mode in modes:
        filled = " / ".join(f.text for f in results[mode][1])
        lines.append(f"{MODES[mode]}: {filled}")
    return "\n".join(lines)


def fill_mask(
    text: str, *, model: str, top_k: int = 5, mask_attention: Literal["none", "zero"] = "none"
) -> None:
    """Prints the top-k tokens per [MASK] and the best whole-word filling of each run of consecutive masks.

    Args:
        text: Text with the tokenizer's mask token, e.g. "北京[MASK][MASK]你！".
        model: Exported Hugging Face directory (or Hub name), or a Lightning checkpoint (.ckpt file or FSDP
            sharded directory) of a fit run.
        top_k: Candidates shown per mask.
        mask_attention: "zero": also run with the [MASK] positions excluded from attention (attention_mask 0)
            and print both side by side.
    """
    if top_k < 1:
        raise MLMAdaptError(f"--top_k={top_k} must be at least 1")
    transformers.logging.disable_progress_bar()
    lm, tokenizer = load_for_inference(model)
    modes = ["none", "zero"] if mask_attention == "zero" else ["none"]
    results = {mode: predict(lm, tokenizer, text, top_k, mode) for mode in modes}
    print(f"model: {model}")
    print(render(text, results))


def fill_mask_main(args: list[str]) -> None:
    """``python -m mlm_adapt fill-mask``."""
    auto_cli(fill_mask, args=args, prog="python -m mlm_adapt fill-mask", exit_on_error=False)
