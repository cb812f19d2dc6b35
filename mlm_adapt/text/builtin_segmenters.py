"""Built-in segmenters beyond jieba: THULAC, snownlp and pkuseg (the ``segmenters`` extra).

Each installs from the package index and runs offline: THULAC and snownlp ship their models; spacy-pkuseg
ships none and would download one on first use, so :class:`PkusegSegmenter` takes a model directory that
is already on disk and never downloads. Models load lazily, once per process, and stay out of the pickled
state (``datasets.map`` workers rebuild them). pkuseg and snownlp drop whitespace: their words get it back
through :func:`~mlm_adapt.text.word_segmenter.restore_whitespace`. Measured speeds: ``docs/segmenters.md``.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.text.word_segmenter import restore_whitespace

EXTRA_HINT = "install it with: pip install 'mlm_adapt[segmenters]'"


class _LazyModel:
    """A segmenter whose model is loaded on first use and left out of the pickled state."""

    package = ""

    def __init__(self) -> None:
        self._model: Any = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_model": None}

    def _load(self) -> Any:
        raise NotImplementedError

    def _cut(self, text: str) -> list[str]:
        raise NotImplementedError

    def _ensure_model(self) -> Any:
        if self._model is None:
            try:
                self._model = self._load()
            except ImportError:
                raise MLMAdaptError(
                    f"data.segmenter: {type(self).__name__} needs the {self.package} package; {EXTRA_HINT}"
                ) from None
        return self._model

    def segment(self, texts: list[str]) -> list[list[str]]:
        """The words of each text; whitespace the model dropped comes back as words of its own."""
        self._ensure_model()
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

    spacy-pkuseg ships no model and downloads a named one (``spacy_ontonotes``, ``medicine``, ``web``...)
    from GitHub on first use; mlm_adapt never downloads at run time. Download the model once (or train one
    with ``spacy_pkuseg.train``) and give its directory, or its name when it is already in ``$PKUSEG_HOME``
    (``~/.pkuseg``).

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
                        f"data.segmenter: pkuseg model {candidate} has features.pkl and no features.msgpack; "
                        "spacy-pkuseg would unpickle it, which can run any code, so mlm_adapt refuses it: "
                        "use a model saved by a current spacy-pkuseg (features.msgpack)"
                    )
                return candidate.resolve()
        raise MLMAdaptError(
            f"data.segmenter: pkuseg model {model!r} is neither a directory with weights.npz nor a model "
            f"in {home}; download it once (spacy-pkuseg's releases) and give its directory as init_args.model"
        )

    def _load(self) -> Any:
        import spacy_pkuseg  # noqa: PLC0415 (optional dependency)

        with contextlib.redirect_stdout(io.StringIO()):
            return spacy_pkuseg.pkuseg(model_name=self.model_dir, user_dict=self.user_dict)

    def _cut(self, text: str) -> list[str]:
        return self._model.cut(text)


BUILTIN_CLASSES: dict[str, type[_LazyModel]] = {
    "thulac": ThulacSegmenter,
    "snownlp": SnownlpSegmenter,
    "pkuseg": PkusegSegmenter,
}
