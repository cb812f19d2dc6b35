"""Domain vocabulary: ``python -m mlm_adapt vocab`` and extending a model with new tokens.

The report answers two questions about a domain corpus before adapting to it:

- Which characters does the model's vocabulary lack? Their tokens become ``[UNK]`` and can never be
  predicted. ``--output_tokens`` writes the most frequent ones for ``model.new_tokens_file``.
- Which domain terms does jieba's dictionary lack? Whole-word masking masks jieba words, so a term jieba
  splits is never masked as a whole. Candidates are the multi-character words that jieba's HMM joins from
  unknown characters; ``--output_dict`` writes them as a user dictionary for ``data.user_dict``.

New tokens (``model.new_tokens_file``) are appended to the tokenizer; each new embedding row starts as the
mean of the embeddings of the pieces the old tokenizer split the token into (``[UNK]`` for an unknown
character), so the model starts from what it already knew rather than from noise. The MLM decoder stays
tied to the input embeddings.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from typing_extensions import override

from mlm_adapt.errors import MLMAdaptError


def read_new_tokens(path: str | Path) -> list[str]:
    """Reads a new-tokens file: one token per line (blank lines and duplicates ignored), UTF-8."""
    path = Path(path)
    if not path.is_file():
        raise MLMAdaptError(
            f"model.new_tokens_file: {path} does not exist; give a file with one token per line"
        )
    tokens = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return list(dict.fromkeys(t for t in tokens if t))


def extend_tokenizer(tokenizer: PreTrainedTokenizerBase, tokens: Sequence[str]) -> list[str]:
    """Adds the tokens missing from ``tokenizer``'s vocabulary, in order; returns those added."""
    vocab = tokenizer.get_vocab()
    new = [t for t in tokens if t not in vocab]
    tokenizer.add_tokens(new)
    return new


def extend_embeddings(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, tokens: Sequence[str]
) -> list[str]:
    """Extends ``tokenizer`` (in place) and resizes ``model``, each new row the mean of its old pieces.

    Args:
        model: A masked-LM whose vocabulary matches ``tokenizer``.
        tokenizer: Its tokenizer, before the new tokens are added.
        tokens: Tokens to add.

    Returns:
        The tokens actually added (those not already in the vocabulary).
    """
    vocab = tokenizer.get_vocab()
    new = [t for t in tokens if t not in vocab]
    if not new:
        return new
    pieces = [tokenizer(t, add_special_tokens=False)["input_ids"] or [tokenizer.unk_token_id] for t in new]
    old_size = model.get_input_embeddings().weight.shape[0]
    extend_tokenizer(tokenizer, new)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    embeddings = model.get_input_embeddings().weight
    decoder = model.get_output_embeddings()
    bias = getattr(decoder, "bias", None) if decoder is not None else None
    with torch.no_grad():
        for row, ids in enumerate(pieces, start=old_size):
            embeddings[row] = embeddings[ids].mean(0)
            if bias is not None and bias.shape[0] > row:
                bias[row] = bias[ids].mean(0)
    model.tie_weights()
    return new


def oov_characters(texts: Iterable[str], tokenizer: PreTrainedTokenizerBase) -> tuple[Counter, int, int]:
    """Counts the characters the tokenizer maps to ``[UNK]``.

    Returns:
        ``(oov_counts, unk_tokens, total_tokens)`` over ``texts``.
    """
    texts = list(texts)
    chars = Counter(ch for text in texts for ch in text if not ch.isspace())
    distinct = list(chars)
    unk = tokenizer.unk_token_id
    ids = tokenizer(distinct, add_special_tokens=False)["input_ids"] if distinct else []
    oov = Counter({ch: chars[ch] for ch, piece in zip(distinct, ids, strict=True) if piece == [unk]})
    unk_tokens = total = 0
    for start in range(0, len(texts), 1000):
        for row in tokenizer(texts[start : start + 1000], add_special_tokens=False)["input_ids"]:
            total += len(row)
            unk_tokens += sum(1 for i in row if i == unk)
    return oov, unk_tokens, total


def _is_cjk(word: str) -> bool:
    return all("\u4e00" <= ch <= "\u9fff" for ch in word)


def cohesion(term: str, corpus: str) -> float:
    """Least pointwise mutual information (natural log) over the ways to split ``term`` in two.

    High for terms whose parts rarely occur apart (``标间``, hotel jargon), low for chance combinations of
    frequent words (``这是``), which the HMM also joins.
    """
    n, joint = max(len(corpus), 1), max(corpus.count(term), 1)
    return min(
        math.log(joint * n / (max(corpus.count(term[:i]), 1) * max(corpus.count(term[i:]), 1)))
        for i in range(1, len(term))
    )


def candidate_terms(
    texts: Iterable[str], user_dict: str | None = None, min_count: int = 5, min_cohesion: float = 3.0
) -> Counter:
    """Multi-character Chinese words that jieba's HMM finds in ``texts`` but its dictionary lacks.

    Args:
        texts: The domain corpus.
        user_dict: A jieba user dictionary already in use (its words count as known).
        min_count: Keep terms seen at least this often.
        min_cohesion: Keep terms whose :func:`cohesion` is at least this (``e**3 = 20`` times more often
            together than by chance by default).
    """
    import rjieba

    from mlm_adapt.segment import read_user_dict

    dictionary = rjieba.Jieba()
    for word, freq, tag in read_user_dict(user_dict) if user_dict else []:
        dictionary.add_word(word, freq, tag)
    texts = list(texts)
    counts = Counter(w for text in texts for w in dictionary.cut(text, True) if len(w) > 1 and _is_cjk(w))
    counts = Counter({w: c for w, c in counts.items() if c >= min_count and not dictionary.has_word(w)})
    corpus = "\n".join(texts)
    return Counter({w: c for w, c in counts.items() if cohesion(w, corpus) >= min_cohesion})


def write_user_dict(terms: Counter, path: str | Path) -> None:
    """Writes terms one per line, without a frequency: jieba then suggests one that keeps each term whole."""
    Path(path).write_text("".join(f"{w}\n" for w, _ in terms.most_common()), encoding="utf-8")


def _make_cli():
    from mlm_adapt.data import MLMDataModule
    from mlm_adapt.preview import PreviewCLI

    class VocabCLI(PreviewCLI):
        """Parses a fit config and builds only the DataModule (its corpus, tokenizer and segmenter)."""

        @override
        def add_arguments_to_parser(self, parser) -> None:
            super(PreviewCLI, self).add_arguments_to_parser(parser)
            parser.add_argument(
                "--output_dict",
                type=str | None,
                default=None,
                help="Write the proposed terms as a jieba user dictionary (for data.user_dict).",
            )
            parser.add_argument(
                "--output_tokens",
                type=str | None,
                default=None,
                help="Write the top OOV characters, one per line (for model.new_tokens_file).",
            )
            parser.add_argument("--min_count", type=int, default=5, help="Least count of a proposed term.")
            parser.add_argument(
                "--min_cohesion", type=float, default=3.0, help="Least PMI (nats) between a term's parts."
            )
            parser.add_argument("--top_k", type=int, default=30, help="How many characters/terms to list.")

        @override
        def instantiate_classes(self) -> None:
            self.datamodule = MLMDataModule(**self.config["data"].as_dict())

    return VocabCLI


def vocab_main(args: list[str]) -> None:
    """Reports the corpus' ``[UNK]`` rate, OOV characters and candidate jieba terms; writes them on demand."""
    cli = _make_cli()(args=args, run=False, save_config_callback=None)
    config, datamodule = cli.config, cli.datamodule
    hp = datamodule.hparams
    texts = list(datamodule.train_documents()["text"])
    oov, unk_tokens, total = oov_characters(texts, datamodule.tokenizer)
    print(f"corpus: {len(texts):,} documents, {total:,} tokens; tokenizer {hp.tokenizer_name_or_path}")
    print(
        f"[UNK] rate: {unk_tokens / max(total, 1):.4%} "
        f"({unk_tokens:,} tokens, {len(oov):,} distinct OOV characters)"
    )
    if oov:
        print(f"\nmost frequent OOV characters (share of all [UNK]):\n{'char':<6}{'count':>8}{'share':>9}")
        for ch, n in oov.most_common(config.top_k):
            print(f"{ch:<6}{n:>8}{n / max(unk_tokens, 1):>9.1%}")
    if unk_tokens > sum(oov.values()):
        print(
            "(other [UNK]: words WordPiece cannot assemble from its pieces, e.g. a letter glued to a symbol)"
        )
    terms = candidate_terms(texts, hp.user_dict, config.min_count, config.min_cohesion)
    print(
        f"\n{len(terms):,} candidate jieba terms (HMM words missing from the dictionary, count >= "
        f"{config.min_count}, cohesion >= {config.min_cohesion}); top {min(config.top_k, len(terms))}:\n"
        f"{'term':<10}{'count':>8}{'cohesion':>10}"
    )
    corpus = "\n".join(texts)
    for word, n in terms.most_common(config.top_k):
        print(f"{word:<10}{n:>8}{cohesion(word, corpus):>10.2f}")
    if config.output_dict:
        write_user_dict(terms, config.output_dict)
        print(f"\nwrote {len(terms):,} terms to {config.output_dict} (use it as data.user_dict)")
    if config.output_tokens:
        chars = [ch for ch, _ in oov.most_common(config.top_k)]
        Path(config.output_tokens).write_text("".join(f"{ch}\n" for ch in chars), encoding="utf-8")
        print(f"wrote {len(chars):,} characters to {config.output_tokens} (use it as model.new_tokens_file)")
