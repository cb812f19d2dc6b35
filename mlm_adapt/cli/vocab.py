"""``python -m mlm_adapt vocab``: the domain vocabulary report (see :mod:`mlm_adapt.text.tokenizer`).

It answers two questions about a domain corpus before adapting to it:

- Which characters does the model's vocabulary lack? Their tokens become ``[UNK]`` and can never be
  predicted. ``--output_tokens`` writes the most frequent ones for ``model.new_tokens_file``.
- Which domain terms does ``data.segmenter`` split? Whole-word masking masks its words, so a term it
  splits is never masked as a whole. Candidates are the multi-character words that jieba's HMM joins from
  unknown characters and the segmenter splits; ``--output_dict`` writes them as a jieba user dictionary
  for ``data.user_dict``.
"""

from __future__ import annotations

from lightning.pytorch.cli import LightningArgumentParser
from typing_extensions import override

from mlm_adapt.cli.preview import DataOnlyCLI
from mlm_adapt.export.callback import hparams_inputs
from mlm_adapt.guard.outputs import Output, check_output, refuse_same_outputs, write_text
from mlm_adapt.text.tokenizer import candidate_terms, cohesion, oov_characters, write_user_dict


class VocabCLI(DataOnlyCLI):
    """Parses a fit config (with ``--data.*``/``--model.*`` overrides) plus the report's own options."""

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
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


def vocab_main(args: list[str]) -> None:
    """Reports the corpus' ``[UNK]`` rate, OOV characters and candidate terms; writes them on demand."""
    cli = VocabCLI(args=args, run=False, save_config_callback=None)
    config, datamodule = cli.config, cli.datamodule
    hp = datamodule.hparams
    # Checked before the corpus is read: an output must never replace the corpus or the model it reports on.
    inputs = hparams_inputs(config["model"].as_dict(), dict(hp))
    outputs = {
        name: Output(path, key=f"--{name}", directory=False, inputs=inputs)
        for name, path in (("output_dict", config.output_dict), ("output_tokens", config.output_tokens))
        if path
    }
    refuse_same_outputs(outputs.values())
    for output in outputs.values():
        check_output(output)
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
    segmenter = datamodule.segmenter
    terms = candidate_terms(texts, hp.user_dict, config.min_count, config.min_cohesion, segmenter)
    print(
        f"\n{len(terms):,} candidate terms (HMM words that {segmenter.name} splits, count >= "
        f"{config.min_count}, cohesion >= {config.min_cohesion}); top {min(config.top_k, len(terms))}:\n"
        f"{'term':<10}{'count':>8}{'cohesion':>10}"
    )
    corpus = "\n".join(texts)
    for word, n in terms.most_common(config.top_k):
        print(f"{word:<10}{n:>8}{cohesion(word, corpus):>10.2f}")
    if "output_dict" in outputs:
        write_user_dict(terms, outputs["output_dict"])
        print(f"\nwrote {len(terms):,} terms to {config.output_dict} (use it as data.user_dict)")
    if "output_tokens" in outputs:
        chars = [ch for ch, _ in oov.most_common(config.top_k)]
        write_text(outputs["output_tokens"], "".join(f"{ch}\n" for ch in chars))
        print(f"wrote {len(chars):,} characters to {config.output_tokens} (use it as model.new_tokens_file)")
