"""``data.segmenter`` resolved and checked: the one segmentation that fit, preview and vocab all use.

:class:`Segmentation` takes what the config gives -- a built-in name (``rjieba``, ``jieba``, ``thulac``,
``snownlp``, ``pkuseg``), a ``{"class_path": ..., "init_args": {...}}`` mapping or an instance of any
:class:`~mlm_adapt.text.word_segmenter.WordSegmenter` -- and optionally an OpenCC configuration
(:mod:`mlm_adapt.text.chinese_variants`). Every batch is checked: a segmenter that raises, returns the
wrong number of word lists or words that do not join back to the text stops preprocessing with one line
naming the segmenter and the first offending text.

Its pickled state is what ``datasets``' cache fingerprint hashes: the built-in name or the class path with
its init args, the jieba options and the OpenCC configuration (a class-path segmenter is rebuilt from them
in each worker process, so its loaded model is neither pickled nor hashed).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from mlm_adapt.errors import Interrupted, MLMAdaptError, exception_line
from mlm_adapt.text.builtin_segmenters import BUILTIN_CLASSES
from mlm_adapt.text.chinese_variants import ChineseConverter, split_like
from mlm_adapt.text.segment import Segmenter
from mlm_adapt.text.word_segmenter import WordSegmenter, class_path, restore_whitespace

BuiltinSegmenter = Literal["rjieba", "jieba", "thulac", "snownlp", "pkuseg"]
JIEBA_BACKENDS = ("rjieba", "jieba")
BUILTIN_NAMES = (*JIEBA_BACKENDS, *BUILTIN_CLASSES)
_PLAIN = (str, int, float, bool, type(None))


def _short(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")


def _import_class(path: str) -> type:
    module_name, _, name = path.rpartition(".")
    try:
        obj: Any = importlib.import_module(module_name) if module_name else None
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise MLMAdaptError(
            f"data.segmenter: cannot import class_path {path!r} ({exc}); give an importable class "
            f"(module.Class) or a built-in name ({', '.join(BUILTIN_NAMES)})"
        ) from None
    return obj


def plain_settings(segmenter: Any) -> Any:
    """A config value describing ``segmenter``: its name, or ``{"class_path", "init_args"}`` (plain values).

    An instance is described by its class and its public attributes of plain types (what a segmenter
    usually keeps of its init args): the form that hyperparameters, checkpoints and the resume check keep.
    """
    if isinstance(segmenter, str | Mapping):
        return dict(segmenter) if isinstance(segmenter, Mapping) else segmenter
    args = {k: v for k, v in vars(segmenter).items() if not k.startswith("_") and isinstance(v, _PLAIN)}
    return {"class_path": class_path(segmenter), "init_args": args}


def _as_list(words: Any) -> list:
    """A segmenter's words (a sequence or generator) as a list; ``[words]`` when not iterable (refused)."""
    try:
        return list(words)
    except TypeError:
        return [words]


class Segmentation:
    """The configured word segmenter with the join-back check (and optional OpenCC conversion).

    Args:
        segmenter: A built-in name, a ``{"class_path": ..., "init_args": {...}}`` mapping or a
            :class:`~mlm_adapt.text.word_segmenter.WordSegmenter` instance.
        hmm: jieba only: let its HMM join unknown characters into words.
        user_dict: jieba only: a user dictionary (``word [freq] [tag]`` per line).
        opencc: Segment an OpenCC-converted copy (``t2s``, ``tw2s``, ``hk2s``); ``None``: the text itself.
        built_from: The name or ``class_path`` mapping an instance ``segmenter`` was built from (what
            LightningCLI keeps as the hyperparameter; ignored otherwise): worker processes rebuild it from
            that instead of pickling it.
    """

    def __init__(
        self,
        segmenter: str | Mapping[str, Any] | WordSegmenter = "rjieba",
        hmm: bool = False,
        user_dict: str | None = None,
        opencc: str | None = None,
        built_from: str | Mapping[str, Any] | None = None,
    ) -> None:
        given = isinstance(segmenter, str | Mapping)
        if given or not isinstance(built_from, str | Mapping):
            built_from = None
        # An instance without ``built_from`` cannot be rebuilt: it is pickled (and hashed) itself.
        self._rebuildable = given or built_from is not None
        self.spec = plain_settings(built_from if built_from is not None else segmenter)
        if isinstance(self.spec, dict) and not isinstance(self.spec.get("class_path"), str):
            raise MLMAdaptError(
                f"data.segmenter: {self.spec} has no class_path; give a built-in name "
                f"({', '.join(BUILTIN_NAMES)}) or {{class_path: module.Class, init_args: {{...}}}}"
            )
        self.name = self.spec if isinstance(self.spec, str) else self.spec["class_path"]
        if (hmm or user_dict) and self.name not in JIEBA_BACKENDS:
            raise MLMAdaptError(
                f"data.hmm/data.user_dict apply to rjieba and jieba, not {self.name}; "
                "give the segmenter's own options in its init_args"
            )
        self.hmm, self.user_dict = hmm, user_dict
        self.converter = ChineseConverter(opencc) if opencc else None
        # Built now, so a bad class path or init args fail at startup, before any preprocessing.
        self._segmenter: Any = self._build() if given else segmenter
        if not callable(getattr(self._segmenter, "segment", None)):
            raise MLMAdaptError(
                f"data.segmenter: {self.name} has no segment(texts) method; a segmenter maps a list of texts "
                "to a list of word lists (see docs/segmenters.md)"
            )

    def _build(self) -> Any:
        if self.name in JIEBA_BACKENDS:
            return Segmenter(self.name, hmm=self.hmm, user_dict=self.user_dict)
        if isinstance(self.spec, str):
            if self.spec not in BUILTIN_CLASSES:
                raise MLMAdaptError(
                    f"data.segmenter: unknown segmenter {self.spec!r}; use one of {', '.join(BUILTIN_NAMES)} "
                    "or a class_path with init_args"
                )
            return BUILTIN_CLASSES[self.spec]()
        cls = _import_class(str(self.spec.get("class_path")))
        init_args = dict(self.spec.get("init_args") or {})
        try:
            return cls(**init_args)
        except MLMAdaptError:
            raise
        except Exception as exc:
            raise MLMAdaptError(
                f"data.segmenter: {self.name}(**{init_args}) failed: {type(exc).__name__}: {exc}; "
                "check data.segmenter.init_args"
            ) from None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        if self._rebuildable and self.name not in JIEBA_BACKENDS:
            state["_segmenter"] = None  # rebuilt from the class path (no model in the pickle or the hash)
        return state

    @property
    def segmenter(self) -> Any:
        """The underlying segmenter (built on first use in a worker process)."""
        if self._segmenter is None:
            self._segmenter = self._build()
        return self._segmenter

    def __call__(self, text: str) -> list[str]:
        """The words of one text."""
        return self.segment([text])[0]

    def _fail(self, problem: str, text: str, hint: str) -> MLMAdaptError:
        return MLMAdaptError(f"data.segmenter: {self.name} {problem} on the text {_short(text)}; {hint}")

    def _run(self, texts: list[str]) -> list[list[str]]:
        try:
            return list(self.segmenter.segment(texts))
        except (MLMAdaptError, Interrupted):
            raise
        except (SystemExit, KeyboardInterrupt) as exc:
            # Raised by the segmenter (or a library it wraps), not by a stop signal: it failed.
            detail = f"exit({exc.code!r})" if isinstance(exc, SystemExit) else "KeyboardInterrupt"
            raise self._fail(
                f"called {detail}", texts[0] if texts else "", "a segmenter must return words, not exit"
            ) from None
        except Exception as exc:
            offending = texts[0] if texts else ""
            for text in texts:  # the error path only: find the text it fails on
                try:
                    self.segmenter.segment([text])
                except Exception:
                    offending = text
                    break
            message = exception_line(exc) if str(exc).strip() else ""
            raise self._fail(
                f"raised {type(exc).__name__}: {message}", offending, "fix the segmenter or its init_args"
            ) from None

    def segment(self, texts: Sequence[str]) -> list[list[str]]:
        """The words of each text, checked to join back to it (see the module docstring)."""
        texts = list(texts)
        source = [self.converter.convert(t) for t in texts] if self.converter else texts
        words = self._run(source)
        if len(words) != len(texts):
            raise self._fail(
                f"returned {len(words)} word lists for {len(texts)} texts",
                texts[0] if texts else "",
                "segment(texts) must return one list of words per text",
            )
        words = [w if isinstance(w, list) else _as_list(w) for w in words]
        for text, converted, text_words in zip(texts, source, words, strict=True):
            try:
                # str.join refuses anything but strings: one C call checks the types and the text.
                joins_back = "".join(text_words) == converted
            except TypeError:
                joins_back = False
            if not joins_back:
                raise self._join_back_error(text, converted, text_words)
        if self.converter:
            return [split_like(text, w) for text, w in zip(texts, words, strict=True)]
        return words

    def _join_back_error(self, text: str, converted: str, words: list) -> MLMAdaptError:
        if all(isinstance(w, str) for w in words) and restore_whitespace(converted, words) is not None:
            hint = (
                "return the whitespace as words of their own "
                "(mlm_adapt.text.word_segmenter.restore_whitespace does that)"
            )
            return self._fail("dropped whitespace", text, hint)
        return self._fail(
            "returned words that do not join back",
            text,
            'its words must concatenate to the text exactly ("".join(words) == text)',
        )

    def __repr__(self) -> str:
        opencc = f", opencc={self.converter.config!r}" if self.converter else ""
        return f"Segmentation({self.name}{opencc})"
