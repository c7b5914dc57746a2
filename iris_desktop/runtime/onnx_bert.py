"""Recall's two ONNX models' common parts: their pinned files (:class:`OnnxModelFiles`),
BERT's uncased WordPiece tokenizer and the onnxruntime session, shared by the two
models: the cross-encoder (:mod:`.reranker`) and the sentence embedder
(:mod:`.onnx_embedder`). Both read the same ``vocab.txt`` (bert-base-uncased's, one sha256).

The tokenizer is written here (about 60 lines) rather than taken from the ``tokenizers``
package, which would bring ``huggingface_hub`` (a network client) into an offline app: the
models' ``tokenizer.json`` asks for exactly this — BertNormalizer (clean text, spaces
around CJK characters, lowercase and strip accents), BertPreTokenizer (whitespace, then
each punctuation character alone), WordPiece with ``##`` continuations and [UNK] for a
word over 100 characters. ``tests/test_reranker.py`` checks it against ids ``tokenizers``
gave.
"""

from __future__ import annotations

import os
import re
import unicodedata
from dataclasses import dataclass
from importlib import resources

from .bundled import BundledModelError, BundledPart

__all__ = ["OnnxModelFiles", "WordPiece", "onnx_session"]


@dataclass(frozen=True)
class OnnxModelFiles:
    """The model and vocabulary an ONNX model of recall loads (the reranker, the embedder),
    pinned by size and sha256, and what Help ▸ Model licenses and About say of them (as for
    the other shipped models)."""

    name: str
    model: BundledPart
    vocab: BundledPart
    #: the longest (query, passage) pair in tokens, [CLS] and both [SEP]s included
    max_tokens: int = 512
    license: str = "Apache-2.0"
    source: str = ""
    display_name: str = ""
    license_url: str = ""
    #: the full license text, a resource of the ``iris_desktop`` package
    license_resource: str = ""
    #: the package the files come from, and its own license
    via: str = ""
    #: an embedder's vector size (0: not an embedder)
    dimensions: int = 0
    #: what an embedder puts before a question (not before a passage)
    query_prefix: str = ""

    @property
    def files(self) -> tuple[BundledPart, BundledPart]:
        return (self.model, self.vocab)

    def license_text(self) -> str:
        return resources.files("iris_desktop").joinpath(self.license_resource).read_text("utf-8")


# ---------------------------------------------------------------------------
# BERT's uncased WordPiece

_CLS, _SEP, _UNK, _PAD = "[CLS]", "[SEP]", "[UNK]", "[PAD]"
_MAX_WORD_CHARS = 100
#: the CJK ideograph blocks BERT puts spaces around (BertNormalizer's handle_chinese_chars)
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


_ASCII_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_ASCII_WORD = re.compile(r"[a-z0-9]+|[!-/:-@\[-`{-~]")


def _is_punctuation(ch: str) -> bool:
    o = ord(ch)
    return 33 <= o <= 47 or 58 <= o <= 64 or 91 <= o <= 96 or 123 <= o <= 126 or \
        unicodedata.category(ch).startswith("P")


class WordPiece:
    """Text → token ids, as the model's ``tokenizer.json`` describes (module docstring)."""

    def __init__(self, vocab_txt: bytes):
        pieces = vocab_txt.decode("utf-8").split("\n")
        if pieces and pieces[-1] == "":
            pieces.pop()
        self.vocab = {piece: i for i, piece in enumerate(pieces)}
        self.cls, self.sep, self.unk = self.vocab[_CLS], self.vocab[_SEP], self.vocab[_UNK]
        self.pad = self.vocab[_PAD]
        self._words: dict[str, list[int]] = {}

    def normalize(self, text: str) -> str:
        if text.isascii():  # most text: nothing to decompose, no CJK
            return _ASCII_CONTROL.sub("", text).lower()
        out = []
        for ch in text:
            o = ord(ch)
            if ch in "\t\n\r" or unicodedata.category(ch) in ("Zs", "Zl", "Zp"):
                out.append(" ")
            elif o == 0 or o == 0xFFFD or unicodedata.category(ch).startswith("C"):
                continue
            elif any(a <= o <= b for a, b in _CJK):
                out.append(f" {ch} ")
            else:
                out.append(ch)
        text = unicodedata.normalize("NFD", "".join(out))
        return "".join(ch for ch in text if unicodedata.category(ch) != "Mn").lower()

    def words(self, text: str) -> list[str]:
        """Whitespace-separated, then each punctuation character on its own."""
        if text.isascii():  # every printable ASCII character that is not a letter or digit is punctuation
            return _ASCII_WORD.findall(self.normalize(text))
        out = []
        for chunk in self.normalize(text).split():
            start = 0
            for i, ch in enumerate(chunk):
                if _is_punctuation(ch):
                    if i > start:
                        out.append(chunk[start:i])
                    out.append(ch)
                    start = i + 1
            if start < len(chunk):
                out.append(chunk[start:])
        return out

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``, without [CLS] and [SEP]."""
        ids: list[int] = []
        for word in self.words(text):
            pieces = self._words.get(word)
            if pieces is None:
                pieces = self._piece(word)
                if len(self._words) < 100_000:
                    self._words[word] = pieces
            ids.extend(pieces)
        return ids

    def _piece(self, word: str) -> list[int]:
        """Greedy longest match first; a word with a part in no piece is one [UNK]."""
        if len(word) > _MAX_WORD_CHARS:
            return [self.unk]
        out, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    out.append(self.vocab[piece])
                    break
                end -= 1
            if end == start:
                return [self.unk]
            start = end
        return out


#: onnxruntime's switches for Microsoft's telemetry (1DS on Linux and macOS since 1.29:
#: a device id written under ~/.cache/Microsoft and a "ProcessInfo" event uploaded to
#: mobile.events.data.microsoft.com). 1.32 reads the first; later releases the second
TELEMETRY_OFF = ("ORT_DISABLE_TELEMETRY", "ORT_TELEMETRY_DISABLED")


def no_telemetry() -> None:
    """Turn onnxruntime's telemetry off for this process, before it is imported: Iris
    sends nothing anywhere the user did not ask for (its own API call,
    ``disable_telemetry_events``, comes after the first event is queued)."""
    for name in TELEMETRY_OFF:
        os.environ[name] = "1"


def onnx_session(model: bytes, part: BundledPart, n_threads: int):
    """An onnxruntime CPU session of ``model`` (bytes already checked against ``part``) on
    ``n_threads`` intra-op threads. Raises BundledModelError: onnxruntime missing, or the
    model refused (naming ``part``'s package to reinstall)."""
    no_telemetry()
    try:
        import onnxruntime as ort  # only here: importing the model modules stays cheap
    except ImportError:
        raise BundledModelError("onnxruntime is not installed — install it with pip install onnxruntime",
                                package="onnxruntime") from None
    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, n_threads)
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own classes
        raise part.error(f"onnxruntime cannot load {part.data_path} ({exc})") from None
