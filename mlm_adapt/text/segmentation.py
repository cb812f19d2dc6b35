"""Word segmentation: what a segmenter is, the built-in ones, and the checked ``data.segmentation.segmenter``.

Whole-word masking needs, for every text, words that concatenate back to it exactly
(``"".join(words) == text``): they are aligned to the tokenizer's own tokens by character position
(:mod:`mlm_adapt.text.alignment`). Any class with ``segment(texts)`` is a segmenter (:class:`WordSegmenter`,
``docs/segmenters.md``); :class:`Segmentation` builds and checks the configured one.

``data.segmentation.segmenter`` is a config value from end to end: a built-in name, or the
``class_path``/``init_args`` that jsonargparse resolves (:data:`SegmenterFactory`: class and init args
checked, nothing built). The data module records that value as given (hyperparameters, checkpoints, the resume
check), and :class:`Segmentation` builds the segmenter from it, by the same jsonargparse resolution, in every
process that segments: the command's own, and each DataLoader worker of a streamed corpus, which gets the
value pickled, never a loaded model. The value is also what the blocks' cache fingerprint hashes.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeAlias, get_args, runtime_checkable

import rjieba
from jsonargparse import ArgumentError, ArgumentParser

from mlm_adapt.errors import MLMAdaptError, exception_line, raised
from mlm_adapt.guard.secrets import withhold
from mlm_adapt.text.numbers import parse_number
from mlm_adapt.text.traditional import EXTRA_HINT, ChineseConverter, OpenCCConfig, split_like


@runtime_checkable
class WordSegmenter(Protocol):
    """Maps a batch of texts (``list[str]``) to their words (``list[list[str]]``, one list of ``str`` per
    text), which must join back to each text; whitespace it drops comes back as words of its own. It must
    pickle (streamed corpora send it to worker processes): load
    models lazily, on first use, and leave them out of the pickled state."""

    # ``Any`` and positional-only: jsonargparse accepts a class for this protocol only when its parameter
    # types equal the protocol's, unless the protocol's are ``Any``, and its names too unless positional
    # only; a user's ``def segment(self, texts)`` without hints, or with another name, is a segmenter.
    def segment(self, texts: Any, /) -> Any:
        """The words of each text, in order."""
        ...


# What a ``class_path`` segmenter parses to: jsonargparse imports the class, checks it has ``segment`` and
# the init args against its ``__init__``, and instantiation gives a factory, not a segmenter. So the command
# line builds nothing: the data module keeps the config value and Segmentation builds it where it segments.
SegmenterFactory: TypeAlias = Callable[[], WordSegmenter]


def restore_whitespace(text: str, words: list[str]) -> list[str] | None:
    """``words`` with the whitespace of ``text`` that the segmenter dropped put back as words of their own.

    Returns ``None`` when the words do not match the text apart from whitespace (the segmenter changed or
    dropped other characters): that is a violation to report, not something to repair.
    """
    if "".join(words) == text:
        return list(words)
    restored: list[str] = []
    pos = 0
    for word in words:
        start = pos
        while pos < len(text) and text[pos].isspace() and not text.startswith(word, pos):
            pos += 1
        if pos > start:
            restored.append(text[start:pos])
        if not text.startswith(word, pos):
            return None
        if word:
            restored.append(word)
        pos += len(word)
    if pos < len(text):
        if not text[pos:].isspace():
            return None
        restored.append(text[pos:])
    return restored


SegmenterBackend = Literal["rjieba", "jieba"]
JIEBA_BACKENDS = get_args(SegmenterBackend)

# rjieba keeps frequencies (and their total) in 64-bit integers; far below that, any word already wins.
MAX_FREQUENCY = 10**12


def jieba_cache_dir() -> Path:
    """jieba's prefix-dictionary cache dir: ``$MLM_ADAPT_JIEBA_CACHE`` or ``~/.cache/mlm_adapt/jieba``.

    jieba's default, in the system temp directory, is shared by every user of a node: a file left there by
    another user cannot be replaced (every process then rebuilds the dictionary) and would be unmarshalled
    without question. A private one, written once per node by ``prepare_data``, lets every rank just load it.
    """
    path = Path(os.environ.get("MLM_ADAPT_JIEBA_CACHE") or Path.home() / ".cache" / "mlm_adapt" / "jieba")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def read_user_dict(path: str | Path) -> list[tuple[str, int | None, str | None]]:
    """Parses a jieba user dictionary (UTF-8, ``word [freq] [tag]`` per line) into ``(word, freq, tag)``
    triples, ``None`` for what a line omits."""
    path = Path(path)
    if not path.is_file():
        raise MLMAdaptError(
            f"data.segmentation.user_dict: {path} does not exist; give a jieba dictionary file or null"
        )
    entries = []
    for lineno, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        try:
            line = raw.decode("utf-8").strip().lstrip("\ufeff")
        except UnicodeDecodeError:
            raise MLMAdaptError(
                f"data.segmentation.user_dict: {path} line {lineno} is not UTF-8; re-save the dictionary as "
                "UTF-8"
            ) from None
        if not line:
            continue
        parts = line.split()
        word, freq, tag = parts[0], None, parts[2] if len(parts) > 2 else None
        if len(parts) > 1:
            freq = int(
                parse_number(
                    parts[1],
                    int,
                    f"data.segmentation.user_dict: {path} line {lineno}: frequency {{value}}",
                    f"use 'word [freq] [tag]' with freq at most {MAX_FREQUENCY} (jieba's own dictionary tops "
                    "out below 10^6)",
                    minimum=0,
                    maximum=MAX_FREQUENCY,
                )
            )
        entries.append((word, freq, tag))
    return entries


class JiebaSegmenter:
    """Splits text into words with jieba's dictionary (precise mode).

    Args:
        backend: ``rjieba`` (fast, Rust) or ``jieba`` (reference Python implementation).
        hmm: Use jieba's HMM to join unknown characters into new words. Off by default: with it off both
            backends agree exactly, and dictionary words are what whole-word masking should mask.
        user_dict: Optional jieba user dictionary (``word [freq] [tag]`` per line), applied to either backend.
    """

    def __init__(self, backend: SegmenterBackend = "rjieba", hmm: bool = False, user_dict: str | None = None):
        if backend not in JIEBA_BACKENDS:
            raise MLMAdaptError(
                f"data.segmentation.segmenter: unknown backend {backend!r}; use 'rjieba' or 'jieba'"
            )
        self.backend = backend
        self.hmm = hmm
        self.user_dict = user_dict
        self._entries = read_user_dict(user_dict) if user_dict else []
        # Pickled with the segmenter: datasets' cache fingerprint changes when the dictionary content does.
        self.user_dict_sha1 = hashlib.sha1(repr(self._entries).encode()).hexdigest() if user_dict else None
        self._impl = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_impl": None}

    def _build(self):
        if self.backend == "rjieba":
            impl = rjieba.Jieba()
            cut = impl.cut  # called directly per text: the hot path of preprocessing
        else:
            import jieba  # noqa: PLC0415 (the reference backend: a slow import, only when chosen)

            jieba.setLogLevel(logging.WARNING)
            impl = jieba.Tokenizer()
            impl.tmp_dir = str(jieba_cache_dir())
            impl.initialize()

            def cut(text: str, hmm: bool) -> list[str]:
                return impl.lcut(text, HMM=hmm)

        for word, freq, tag in self._entries:
            impl.add_word(word, freq, tag)
        return cut

    def __call__(self, text: str) -> list[str]:
        """Returns the words of ``text`` in order; joined they give ``text`` back."""
        return self.segment([text])[0]

    def segment(self, texts: list[str]) -> list[list[str]]:
        """The words of each text (the :class:`WordSegmenter` protocol)."""
        if self._impl is None:
            self._impl = self._build()
        cut, hmm = self._impl, self.hmm
        return [cut(text, hmm) for text in texts]

    def __repr__(self) -> str:
        return f"JiebaSegmenter(backend={self.backend!r}, hmm={self.hmm}, user_dict={self.user_dict!r})"


class _LazyModel:
    """A built-in segmenter whose package and model load on first use, left out of the pickled state.

    A subclass names its ``package`` and defines ``_load`` (the model) and ``_cut`` (one text's words).
    THULAC and snownlp ship their models; pkuseg and snownlp drop whitespace, which comes back through
    :func:`restore_whitespace`. Measured speeds: ``docs/segmenters.md``.
    """

    package = ""

    def __init__(self) -> None:
        self._model: Any = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_model": None}

    def segment(self, texts: list[str]) -> list[list[str]]:
        """The words of each text; whitespace the model dropped comes back as words of its own."""
        if self._model is None:
            try:
                self._model = self._load()
            except ImportError:
                raise MLMAdaptError(
                    f"data.segmentation.segmenter: {type(self).__name__} needs the {self.package} package; "
                    f"{EXTRA_HINT}"
                ) from None
        result = []
        for text in texts:
            words = self._cut(text) if text.strip() else []
            restored = restore_whitespace(text, words)
            # Anything but dropped whitespace is left for the caller's join-back check to report.
            result.append(words if restored is None else restored)
        return result


class ThulacSegmenter(_LazyModel):
    """THULAC (Tsinghua), segmentation only, with the model shipped in the ``thulac`` package.

    Args:
        user_dict: Optional file of extra words, one per line (UTF-8).
    """

    package = "thulac"

    def __init__(self, user_dict: str | None = None) -> None:
        super().__init__()
        self.user_dict = user_dict

    def _load(self) -> Any:
        import thulac  # noqa: PLC0415 (optional dependency, ~6 s to load its model)

        with contextlib.redirect_stdout(io.StringIO()):  # it prints "Model loaded succeed"
            return thulac.thulac(user_dict=self.user_dict, seg_only=True)

    def _cut(self, text: str) -> list[str]:
        return [word for word, _ in self._model.cut(text, text=False)]


class SnownlpSegmenter(_LazyModel):
    """snownlp's character-based generative segmenter (the model ships in the ``snownlp`` package)."""

    package = "snownlp"

    def _load(self) -> Any:
        from snownlp import seg  # noqa: PLC0415 (optional dependency; loads its model on import)

        return seg

    def _cut(self, text: str) -> list[str]:
        return self._model.seg(text)


class PkusegSegmenter(_LazyModel):
    """pkuseg (Peking University) through ``spacy-pkuseg``, from a model directory already on disk.

    spacy-pkuseg ships no model and would download one on first use; mlm_adapt never downloads at run time:
    download it once (or train one with ``spacy_pkuseg.train``) and give its directory.

    Args:
        model: A directory holding ``weights.npz`` and ``features.msgpack``/``features.pkl``, or the name of
            a model already downloaded to ``$PKUSEG_HOME``.
        user_dict: ``default`` (pkuseg's own dictionary), a file of words (one per line) or ``null``.
    """

    package = "spacy-pkuseg"

    def __init__(self, model: str = "spacy_ontonotes", user_dict: str | None = "default") -> None:
        super().__init__()
        self.model = model
        self.user_dict = user_dict
        self.model_dir = str(self._model_dir(model))

    @staticmethod
    def _model_dir(model: str) -> Path:
        home = Path(os.environ.get("PKUSEG_HOME") or Path.home() / ".pkuseg")
        for candidate in (Path(model).expanduser(), home / model):
            if (candidate / "weights.npz").is_file():
                if not (candidate / "features.msgpack").is_file() and (candidate / "features.pkl").exists():
                    # spacy-pkuseg falls back to pickle.load for it: loading the model would run its code.
                    raise MLMAdaptError(
                        f"data.segmentation.segmenter: pkuseg model {candidate} has features.pkl and no "
                        "features.msgpack; spacy-pkuseg would unpickle it, which can run any code, so "
                        "mlm_adapt refuses it: "
                        "use a model saved by a current spacy-pkuseg (features.msgpack)"
                    )
                return candidate.resolve()
        raise MLMAdaptError(
            f"data.segmentation.segmenter: pkuseg model {model!r} is neither a directory with weights.npz "
            f"nor a model in {home}; download it once (spacy-pkuseg's releases) and give its directory as "
            "init_args.model"
        )

    def _load(self) -> Any:
        import spacy_pkuseg  # noqa: PLC0415 (optional dependency)

        with contextlib.redirect_stdout(io.StringIO()):
            return spacy_pkuseg.pkuseg(model_name=self.model_dir, user_dict=self.user_dict)

    def _cut(self, text: str) -> list[str]:
        return self._model.cut(text)


BuiltinSegmenter = Literal["rjieba", "jieba", "thulac", "snownlp", "pkuseg"]
BUILTIN_NAMES = get_args(BuiltinSegmenter)
BUILTIN_CLASSES = {"thulac": ThulacSegmenter, "snownlp": SnownlpSegmenter, "pkuseg": PkusegSegmenter}
_NO_SEGMENT = (
    "has no segment(texts) method; a segmenter maps a list of texts to a list of word lists "
    "(see docs/segmenters.md)"
)
# How jsonargparse says a class_path names a class without ``segment`` (not SegmenterFactory's return type);
# the command line's report (cli/fit.py) is read with it too.
NOT_A_SEGMENTER = re.compile(r"Expected '([^']+)' to be a subclass of <class '(?:\S+\.)?WordSegmenter'>")


def _from_class_path(spec: Mapping[str, Any]) -> Any:
    """The segmenter a ``{"class_path", "init_args"}`` mapping names, resolved by jsonargparse as the
    command line resolves ``data.segmentation.segmenter`` (the same :data:`SegmenterFactory` type), then
    built; its multi-line report becomes one line here."""
    name, init_args = spec["class_path"], dict(spec.get("init_args") or {})
    shown = withhold({"init_args": init_args})["init_args"]  # in the lines: secret arguments withheld
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--segmenter", type=SegmenterFactory)
    try:
        config = parser.parse_object({"segmenter": {"class_path": name, "init_args": init_args}})
    except ArgumentError as exc:
        # jsonargparse wraps what failed (an ImportError, an unknown option) in its own errors.
        chain: list[BaseException] = [exc]
        while (inner := chain[-1].__cause__ or chain[-1].__context__) is not None and inner not in chain:
            chain.append(inner)
        cause = chain[-1]
        reason = exception_line(cause)
        if NOT_A_SEGMENTER.search(reason):
            raise MLMAdaptError(f"data.segmentation.segmenter: {name} {_NO_SEGMENT}") from None
        if isinstance(cause, ImportError | AttributeError) or "import path" in reason:
            raise MLMAdaptError(
                f"data.segmentation.segmenter: cannot import class_path {name!r} ({reason}); give an "
                f"importable class (module.Class) or a built-in name ({', '.join(BUILTIN_NAMES)})"
            ) from None
        raise MLMAdaptError(
            f"data.segmentation.segmenter: {name}(**{shown}) failed: {reason}; check "
            "data.segmentation.segmenter.init_args"
        ) from None
    try:
        return parser.instantiate(config).segmenter()
    except MLMAdaptError:
        raise
    except Exception as exc:
        raise MLMAdaptError(
            f"data.segmentation.segmenter: {name}(**{shown}) failed: {type(exc).__name__}: {exc}; "
            "check data.segmentation.segmenter.init_args"
        ) from None


def segmenter_setting(value: Any) -> str | dict[str, Any]:
    """``data.segmentation.segmenter`` as the data module records it: a built-in name or a ``class_path``
    mapping.

    Anything else (a segmenter object, a class, a factory) is refused in one line: checkpoints, the resume
    check and the cache fingerprint record the setting, and worker processes rebuild the segmenter from it.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return dict(value)
    raise MLMAdaptError(
        f"data.segmentation.segmenter: got a {type(value).__name__} object; give a built-in name "
        f"({', '.join(BUILTIN_NAMES)}) or {{'class_path': 'module.Class', 'init_args': {{...}}}}, the value "
        "a config holds: checkpoints record it and worker processes rebuild the segmenter from it"
    )


def _as_list(value: Any) -> list | None:
    """A segmenter's sequence (a list, tuple or generator) as a list; ``None`` for a string, a mapping or
    something not iterable: no sequence of words (a ``str`` would iterate as characters)."""
    if isinstance(value, list | str | bytes | Mapping):
        return value if isinstance(value, list) else None
    try:
        return list(value)
    except TypeError:
        return None


def _kind(value: Any) -> str:
    return f"a {type(value).__name__}"


class Segmentation:
    """The configured word segmenter with the join-back check (and optional OpenCC conversion).

    A segmenter that raises, returns the wrong number of word lists, something other than a list
    of ``str`` per text, or words that do not join back (whitespace it drops is put back) stops
    preprocessing with one line naming it and the first offending text.

    Args:
        segmenter: A built-in name, a ``{"class_path": ..., "init_args": {...}}`` mapping (built in each
            process that segments, never pickled) or a :class:`WordSegmenter` instance (pickled as it is).
        hmm: jieba only: let its HMM join unknown characters into words.
        user_dict: jieba only: a user dictionary (``word [freq] [tag]`` per line).
        opencc: Segment an OpenCC-converted copy (``t2s``, ``tw2s``, ``hk2s``); ``None``: the text itself.
    """

    def __init__(
        self,
        segmenter: str | Mapping[str, Any] | WordSegmenter = "rjieba",
        hmm: bool = False,
        user_dict: str | None = None,
        opencc: str | None = None,
    ) -> None:
        given = isinstance(segmenter, str | Mapping)
        self.spec: str | dict[str, Any] | None = segmenter_setting(segmenter) if given else None
        if isinstance(self.spec, dict) and not isinstance(self.spec.get("class_path"), str):
            raise MLMAdaptError(
                f"data.segmentation.segmenter: {withhold(self.spec)} has no class_path; give a built-in name "
                f"({', '.join(BUILTIN_NAMES)}) or {{class_path: module.Class, init_args: {{...}}}}"
            )
        if self.spec is None:
            self.name = f"{type(segmenter).__module__}.{type(segmenter).__qualname__}"
        else:
            self.name = self.spec if isinstance(self.spec, str) else self.spec["class_path"]
        if (hmm or user_dict) and self.name not in JIEBA_BACKENDS:
            raise MLMAdaptError(
                "data.segmentation.hmm/data.segmentation.user_dict apply to rjieba and jieba, not "
                f"{self.name}; give the segmenter's own options in its init_args"
            )
        self.hmm, self.user_dict = hmm, user_dict
        self.converter = ChineseConverter(opencc) if opencc else None
        # Built now, so a bad class path or init args fail at startup, before any preprocessing.
        self._segmenter: Any = self._build() if given else segmenter
        # A class-path segmenter is built again in each process that segments: its threads (a pool) or
        # the thread pools of a model it runs do not survive a fork into preprocessing workers.
        self._built_by = os.getpid()
        if not callable(getattr(self._segmenter, "segment", None)):
            raise MLMAdaptError(f"data.segmentation.segmenter: {self.name} {_NO_SEGMENT}")

    def _build(self) -> Any:
        if self.name in JIEBA_BACKENDS:
            return JiebaSegmenter(self.name, hmm=self.hmm, user_dict=self.user_dict)
        if isinstance(self.spec, str):
            if self.spec not in BUILTIN_CLASSES:
                raise MLMAdaptError(
                    f"data.segmentation.segmenter: unknown segmenter {self.spec!r}; use one of "
                    f"{', '.join(BUILTIN_NAMES)} or a class_path with init_args"
                )
            return BUILTIN_CLASSES[self.spec]()
        return _from_class_path(self.spec)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        # Only a config value can be rebuilt; an instance is pickled (and hashed) itself.
        if self.spec is not None and self.name not in JIEBA_BACKENDS:
            state["_segmenter"] = None  # rebuilt from the class path (no model in the pickle or the hash)
        state["_built_by"] = None
        return state

    @property
    def segmenter(self) -> Any:
        """The underlying segmenter (built on first use in a worker process)."""
        stale = isinstance(self.spec, dict) and self._built_by != os.getpid()
        if self._segmenter is None or stale:
            self._segmenter, self._built_by = self._build(), os.getpid()
        return self._segmenter

    def __call__(self, text: str) -> list[str]:
        """The words of one text."""
        return self.segment([text])[0]

    def _fail(self, problem: str, text: str, hint: str) -> MLMAdaptError:
        short = repr(text if len(text) <= 60 else text[:60] + "…")
        return MLMAdaptError(
            f"data.segmentation.segmenter: {self.name} {problem} on the text {short}; {hint}"
        )

    def _run(self, texts: list[str]) -> Any:
        try:
            return self.segmenter.segment(texts)  # checked by checked_words
        except MLMAdaptError:
            raise
        except Exception as exc:
            offending = texts[0] if texts else ""
            for text in texts:  # the error path only: find the text it fails on
                try:
                    self.segmenter.segment([text])
                except Exception:
                    offending = text
                    break
            raise self._fail(raised(exc), offending, "fix the segmenter or its init_args") from None

    def segment(self, texts: Sequence[str]) -> list[list[str]]:
        """The words of each text, checked (:meth:`checked_words`; see the module docstring)."""
        texts = list(texts)
        source = [self.converter.convert(t) for t in texts] if self.converter else texts
        words = self.checked_words(texts, source, self._run(source))
        if self.converter:
            return [split_like(text, w) for text, w in zip(texts, words, strict=True)]
        return words

    def checked_words(self, texts: list[str], source: list[str], output: Any) -> list[list[str]]:
        """The one check of what ``segment(source)`` returned: a list of ``str`` per text whose concatenation
        is the text, apart from whitespace the segmenter dropped (put back as words of its own:
        :func:`restore_whitespace`). Otherwise one line naming the segmenter and the first bad text (of
        ``texts``, the user's own: ``source`` may be their OpenCC conversion)."""
        word_lists = _as_list(output)
        if word_lists is None or len(word_lists) != len(texts):
            got = _kind(output) if word_lists is None else f"{len(word_lists)} word lists"
            raise self._fail(
                f"returned {got} for {len(texts)} texts",
                texts[0] if texts else "",
                "segment(texts) must return a list with one list of words per text",
            )
        checked = []
        for text, converted, value in zip(texts, source, word_lists, strict=True):
            words = _as_list(value)
            if words is None:
                raise self._fail(
                    f"returned {_kind(value)} instead of a list of words",
                    text,
                    "segment(texts) must return one list of words (str) per text: [['北京', '欢迎', '你']]",
                )
            try:
                # str.join refuses anything but strings: one C call checks the types and the text.
                joins_back = "".join(words) == converted
            except TypeError:
                bad = next(w for w in words if not isinstance(w, str))
                raise self._fail(
                    f"returned {_kind(bad)} ({bad!r}) among the words", text, "every word must be a str"
                ) from None
            if not joins_back:
                words = restore_whitespace(converted, words)
                if words is None:
                    raise self._fail(
                        "returned words that do not join back",
                        text,
                        'its words must concatenate to the text exactly ("".join(words) == text), apart from '
                        "whitespace it drops",
                    )
            checked.append(words)
        return checked

    def __repr__(self) -> str:
        opencc = f", opencc={self.converter.config!r}" if self.converter else ""
        return f"Segmentation({self.name}{opencc})"


@dataclass(kw_only=True, frozen=True)
class SegmentationOptions:
    """How the corpus is cut into words, the units masked as a whole (``data.segmentation``;
    docs/segmenters.md).

    Args:
        segmenter: ``rjieba`` (fast) or ``jieba`` (same words), ``thulac``, ``snownlp``, ``pkuseg``, or a
            class_path/init_args of any class whose ``segment(texts)`` words join back (docs/segmenters.md);
            in Python, the same name or ``{"class_path": ..., "init_args": {...}}`` mapping.
        hmm: Let jieba's HMM join unknown characters into words (off: both backends agree exactly).
        user_dict: A jieba user dictionary (``word [freq] [tag]`` per line) for domain terms.
        opencc: Traditional Chinese: segment a ``t2s``/``tw2s``/``hk2s``-converted copy, keep the original.
    """

    segmenter: BuiltinSegmenter | SegmenterFactory = "rjieba"
    hmm: bool = False
    user_dict: str | None = None
    opencc: OpenCCConfig | None = None

    def check(self) -> SegmentationOptions:
        """The options (:class:`Segmentation` checks the segmenter when it builds it, at startup)."""
        return self
