"""Benchmark: mlm_adapt's whole-word collator vs transformers' DataCollatorForLanguageModeling.

Same sequences, one CPU thread, ms per batch (median of interleaved rounds) for 32x512 (packed reviews)
and 256x128 (line-by-line reviews, padded per batch). Baselines: transformers' whole-word mode (words from
``offset_mapping``, a batch x L x L comparison) and its token-level mode, each fed the inputs transformers
recommends (``special_tokens_mask``). Goal: >= 20x faster than the whole-word baseline.

    python scripts/benchmarks/bench_collator.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _bench_common import interleaved_ms, machine, reviews, table, tiny_model  # noqa: E402
from transformers import AutoTokenizer, DataCollatorForLanguageModeling  # noqa: E402

from mlm_adapt.masking import WholeWordMaskCollator  # noqa: E402
from mlm_adapt.text.alignment import tokenize_with_word_ids  # noqa: E402
from mlm_adapt.text.blocks import build_blocks
from mlm_adapt.text.segmentation import JiebaSegmenter  # noqa: E402


def hf_features(texts: list[str], tokenizer, max_length: int, padded_length: int, packed: bool) -> list[dict]:
    """HF-style features of the same text: input_ids, special_tokens_mask and offset_mapping.

    Pre-padded to the length our collator pads the batch to: transformers' whole-word mode cannot pad
    ``offset_mapping`` itself.
    """
    if packed:  # fill every row: enough text for max_length tokens
        joined = "".join(texts)
        texts = [joined[i * 2 * max_length : (i + 1) * 2 * max_length] for i in range(len(texts))]
    encoding = tokenizer(
        texts,
        truncation=True,
        max_length=max_length,
        padding="max_length",
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
    )
    encoding = tokenizer.pad(encoding, padding="max_length", max_length=padded_length)
    features = [{k: encoding[k][i] for k in encoding} for i in range(len(texts))]
    for f in features:  # tokenizer.pad leaves offset_mapping alone
        f["offset_mapping"] = f["offset_mapping"] + [(0, 0)] * (padded_length - len(f["offset_mapping"]))
    return features


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    model_dir = tiny_model(Path(tempfile.gettempdir()) / "mlm_adapt_bench" / "tiny-bert")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    texts = reviews()[:6000]
    tokens = tokenize_with_word_ids(texts, tokenizer, JiebaSegmenter())

    ours = WholeWordMaskCollator(tokenizer, seed=0)
    hf_wwm = DataCollatorForLanguageModeling(tokenizer, whole_word_mask=True, seed=0)
    hf_tok = DataCollatorForLanguageModeling(tokenizer, seed=0)
    rows = []
    for batch_size, length, packed in ((32, 512, True), (256, 128, False)):
        blocks = build_blocks(
            tokens["input_ids"],
            tokens["word_ids"],
            length,
            tokenizer.cls_token_id,
            tokenizer.sep_token_id,
            packing=packed,
        )
        pairs = zip(blocks["input_ids"][:batch_size], blocks["word_ids"][:batch_size], strict=True)
        feats = [
            {"input_ids": np.asarray(i, np.int32), "word_ids": np.asarray(w, np.int32), "example_id": n}
            for n, (i, w) in enumerate(pairs)
        ]
        shape = tuple(ours(feats)["input_ids"].shape)
        hf = hf_features(texts[:batch_size], tokenizer, length, shape[1], packed)
        # transformers' advice: pass special_tokens_mask, or the collator recomputes it per row.
        hf_ids = [{"input_ids": f["input_ids"], "special_tokens_mask": f["special_tokens_mask"]} for f in hf]
        ms = interleaved_ms(
            {
                "mlm_adapt whole-word": lambda feats=feats: ours(feats),
                "transformers whole-word": lambda hf=hf: hf_wwm([dict(f) for f in hf]),
                "transformers token-level": lambda hf_ids=hf_ids: hf_tok([dict(f) for f in hf_ids]),
            },
            rounds=args.rounds,
            per_round=max(1, 4096 // (batch_size * length // 128)),
        )
        base = ms["transformers whole-word"]
        for name, value in ms.items():
            rows.append(
                [
                    f"{batch_size}x{length}" + (" packed" if packed else " lines"),
                    f"{tuple(shape)}",
                    name,
                    f"{value:.2f}",
                    f"{base / value:.1f}x",
                ]
            )
    print(f"# bench_collator: {machine()}, 1 torch thread")
    print(
        table(
            ["batch", "our padded shape", "collator", "ms/batch", "speed-up vs transformers whole-word"], rows
        )
    )


if __name__ == "__main__":
    main()
