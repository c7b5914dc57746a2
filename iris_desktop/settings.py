"""One typed settings model: every key, its type, range, default and help text.

The TOML file, the environment (``IRIS_<KEY>``), the CLI (``--set`` and ``config``) and the
settings dialog are all generated from :data:`SETTINGS`. Adding a key here adds it
everywhere.

Sources are layered: defaults < TOML file < environment < CLI ``--set``. A bad value in
the file or the environment is reported in :attr:`Settings.problems` and that key falls
back to the layer below; the file is never rewritten behind the user's back. ``config
set`` edits the file in place (tomlkit): comments, order and other keys stay as written.
ADR-0079's variables (``IRIS_COMPACTION_*``) are not read; a problem names the key to use.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import sys
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError

from iris_desktop.files import atomic_write, exclusive_lock, file_kind
from iris_desktop.paths import DataDirError, make_private_dir

BUNDLED = "bundled"
AUTO = "auto"
OFF = "off"


#: the longest text a setting takes (a system prompt of ~50,000 tokens): the settings
#: file it is kept in is read only up to MAX_CONFIG_BYTES
MAX_TEXT_CHARS = 200_000


class SettingsError(ValueError):
    """An invalid key or value. The message names the key, the value and what is allowed."""


@dataclass(frozen=True)
class Setting:
    key: str
    kind: str  # "int" | "float" | "bool" | "str" | "choice" | "list" | "path" | "window" | "url" | "gpu"
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    unit: str = ""
    #: changing it needs the model to be reloaded
    needs_reload: bool = False
    #: read only when Iris starts: a change is not in use until the next start (a running
    #: window that follows the settings file says so rather than "in force")
    at_start: bool = False
    #: for "list": the values allowed in the list (empty = any string)
    item_choices: tuple[str, ...] = ()
    #: for "str": edited as several lines (a prompt), not one
    multiline: bool = False
    #: what the user reads in Preferences, in plain words (the key is shown under it)
    label: str = ""
    #: for "int": 0 is allowed too, outside the range, and means this ("the system's size")
    zero_means: str = ""
    #: for "list": each item is a folder, an absolute path or one from ~ (a relative one
    #: would mean a different folder for each place Iris is started from)
    folders: bool = False

    @property
    def section(self) -> str:
        return self.key.split(".", 1)[0]

    @property
    def env_var(self) -> str:
        return "IRIS_" + self.key.upper().replace(".", "_")

    def describe_allowed(self) -> str:
        """The allowed values in words, for error messages and the dialog."""
        if self.kind == "window":
            return f"'auto' or an integer from {int(self.minimum):,} to {int(self.maximum):,}"
        if self.kind == "gpu":
            return (f"'{AUTO}', '{OFF}' or a number of layers from {int(self.minimum):,} to "
                    f"{int(self.maximum):,} (more than the model has: all of them)")
        if self.kind in ("int", "float"):
            noun = "an integer" if self.kind == "int" else "a number"
            zero = f"0 ({self.zero_means}) or " if self.zero_means else ""
            return f"{zero}{noun} from {_fmt(self.minimum)} to {_fmt(self.maximum)}"
        if self.kind == "bool":
            return "true or false"
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.kind == "list":
            if self.item_choices:
                return "a list drawn from " + ", ".join(self.item_choices)
            if self.folders:
                return "a list of folders, each an absolute path or one starting with ~"
            return "a list of strings"
        if self.kind == "path":
            return f"'{BUNDLED}' or a file's full path (absolute, or starting with ~)"
        if self.kind == "url":
            return "empty, or an http:// or https:// address such as http://127.0.0.1:8080/v1"
        return f"text of at most {MAX_TEXT_CHARS:,} characters"

    def parse(self, raw: Any) -> Any:
        """Convert a raw value (a string from the environment/CLI, or a TOML value) and validate it."""
        try:
            value = self._convert(raw)
        except (TypeError, ValueError, RecursionError) as exc:
            reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            raise SettingsError(
                f"{self.key}: invalid value {_shown(raw)}: expected {self.describe_allowed()}"
                + (f" ({reason})" if reason else "")
            ) from None
        self.validate(value, shown=raw)
        return value

    def validate(self, value: Any, shown: Any = None) -> None:
        """Raise SettingsError unless ``value`` (already converted) is allowed."""
        bad = (
            f"{self.key}: invalid value {_shown(value) if shown is None else _shown(shown)}: "
            f"expected {self.describe_allowed()}"
        )
        if self.kind in ("window", "gpu") and value == AUTO:
            return
        if self.kind == "gpu" and value == OFF:
            return
        if self.kind in ("int", "float", "window", "gpu"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise SettingsError(bad)
            if self.kind in ("int", "window", "gpu") and not isinstance(value, int):
                raise SettingsError(bad)
            if isinstance(value, float) and not math.isfinite(value):
                raise SettingsError(bad)
            if self.zero_means and value == 0:
                return
            if (self.minimum is not None and value < self.minimum) or (
                self.maximum is not None and value > self.maximum
            ):
                raise SettingsError(bad)
        elif self.kind == "bool":
            if not isinstance(value, bool):
                raise SettingsError(bad)
        elif self.kind == "choice":
            if value not in self.choices:
                raise SettingsError(bad)
        elif self.kind == "list":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise SettingsError(bad)
            unknown = [v for v in value if self.item_choices and v not in self.item_choices]
            if unknown:
                raise SettingsError(bad + f" (unknown: {', '.join(unknown)})")
            relative = [v for v in value if self.folders and not _absolute(os.path.expanduser(v))]
            if relative:
                raise SettingsError(bad + f" ({relative[0]!r} is not an absolute path)")
        elif self.kind in ("str", "path"):
            if not isinstance(value, str):
                raise SettingsError(bad)
            if self.kind == "path" and not value.strip():
                raise SettingsError(bad)
            if self.kind == "path" and value != BUNDLED and not _absolute(os.path.expanduser(value)):
                # it would be the file of the folder Iris was started from (Preferences refused it)
                named = value if len(value) <= 80 else value[:80] + "…"
                raise SettingsError(f"{self.key}: {named} is not a full path; give the file's full "
                                    f"path (absolute, or starting with ~), or '{BUNDLED}'")
            if len(value) > MAX_TEXT_CHARS:  # the settings file holds at most MAX_CONFIG_BYTES
                raise SettingsError(f"{self.key}: {len(value):,} characters is too long: expected "
                                    f"{self.describe_allowed()}")
        elif self.kind == "url":
            if not isinstance(value, str) or (value and not _is_http_url(value)):
                raise SettingsError(bad)
            if _has_userinfo(value):  # user:password@host
                instead = ("give the hub's token in Model ▸ Download… ▸ Token… or with "
                           "'iris-desktop models token'" if self.key == "models.hub_url" else
                           "give the server's API key in Model ▸ Server…")
                raise SettingsError(
                    f"{self.key}: an address with a user name or password in it is not "
                    "accepted: it would be kept in plain text in config.toml and written to "
                    f"the log; {instead} instead (the system keyring keeps it)")
            if _has_query(value):  # ?api_key=… was kept in config.toml, refused only later
                raise SettingsError(
                    f"{self.key}: an address with a query string or fragment (after ? or #) "
                    "is not accepted: Iris does not send it, and a key in it would be kept in "
                    "plain text in config.toml; remove it (a key goes in the system keyring: "
                    + ("Model ▸ Download… ▸ Token…)" if self.key == "models.hub_url"
                       else "Model ▸ Server…)"))

    def _convert(self, raw: Any) -> Any:
        if self.kind == "gpu":
            return _gpu_value(raw)
        if not isinstance(raw, str):
            if self.kind == "float" and isinstance(raw, int) and not isinstance(raw, bool):
                return float(raw)
            return raw
        text = raw.strip()
        if self.kind == "window":
            return AUTO if text.lower() == AUTO else _number(int, text)
        if self.kind == "int":
            return _number(int, text)
        if self.kind == "float":
            return _number(float, text)
        if self.kind == "bool":
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError("")
        if self.kind == "list":
            if text.startswith("["):
                value = json.loads(text)
                if not isinstance(value, list):
                    raise ValueError("not a list")
                return value
            return [part.strip() for part in text.split(",") if part.strip()]
        if self.kind == "choice":
            return text.lower()
        if self.kind == "url":
            return text.rstrip("/")
        return raw

    def to_text(self, value: Any) -> str:
        """The value as a user would type it on the CLI."""
        if self.kind == "list":
            return ",".join(value)
        if self.kind == "bool":
            return "true" if value else "false"
        return str(value)


def _absolute(path: str) -> bool:
    """An absolute path on either kind of system: a settings file may be shared, and
    'C:\\notes' in it is absolute where it is meant, as '/home/me/notes' is."""
    import ntpath
    import posixpath

    return posixpath.isabs(path) or ntpath.isabs(path)


#: an integer with thousands separators (1,048,576), as :func:`_fmt` writes one
_GROUPED = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+")


def _number(kind: type, text: str) -> Any:
    """``int(text)`` or ``float(text)``; a ValueError without Python's own wording ("invalid
    literal for int() with base 10"): the message says what is expected instead. An
    integer may be written with thousands separators, as the allowed range is said
    ("4,096"; not "4,09", nor a float's "0,5")."""
    if kind is int and _GROUPED.fullmatch(text):
        text = text.replace(",", "")
    try:
        return kind(text)
    except ValueError:
        raise ValueError("") from None


def _gpu_value(raw: Any) -> Any:
    """model.gpu: 'auto', 'off' (also 0, as the old n_gpu_layers wrote CPU only) or a
    layer count, from a TOML value or typed text."""
    if isinstance(raw, str):
        text = raw.strip().lower()
        if text in (AUTO, OFF):
            return text
        raw = _number(int, text)
    if isinstance(raw, int) and not isinstance(raw, bool) and raw == 0:
        return OFF
    return raw


def _has_userinfo(text: str) -> bool:
    """The address names a user (and perhaps a password) before its host."""
    from urllib.parse import urlsplit

    return "@" in urlsplit(text).netloc


def _has_query(text: str) -> bool:
    """The address has a query string or a fragment (``?api_key=…``)."""
    from urllib.parse import urlsplit

    parts = urlsplit(text.strip())
    return bool(parts.query or parts.fragment)


def _is_http_url(text: str) -> bool:
    """An http(s) address with a host and nothing a request line could be split with."""
    from urllib.parse import urlsplit

    if any(c.isspace() or ord(c) < 32 for c in text):
        return False
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` for a message, cut to about ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _fmt(number: float | None) -> str:
    if number is None:
        return "?"
    return f"{int(number):,}" if float(number).is_integer() else str(number)  # (as every count is said)


TOOL_CHOICES = ("read_file", "list_directory", "search_files", "run_shell")

_ALL: tuple[Setting, ...] = (
    # -- context ---------------------------------------------------------------------------
    Setting(
        "context.window", "window", AUTO,
        "How many tokens Iris plans each request and its reply for. auto: the context "
        "size the model was loaded with (before a model is loaded: \"Model context size\", "
        "model.n_ctx).",
        minimum=512, maximum=1_048_576, unit="tokens",
        label="Context window",
    ),
    Setting(
        "context.token_budget_ratio", "float", 0.70,
        "The share of the context window one request may fill: the system prompt, the tool "
        "descriptions, a summary and the conversation itself. The rest is kept for the "
        "model's reply. Raising it sends more of a long chat word for word before its oldest "
        "turns wait for a summary, and leaves less room for the reply.",
        minimum=0.1, maximum=0.95, unit="× window",
        label="How much of the window a request may fill",
    ),
    Setting(
        "context.compaction_threshold", "float", 0.75,
        "Summarize older turns when the last request's size (its prompt tokens) reaches this "
        "share of the window (the meter's red line), or before, when the oldest turns no "
        "longer fit the budget (the dashed line): whichever comes first.",
        minimum=0.2, maximum=0.98, unit="× window",
        label="When older turns are summarized",
    ),
    Setting(
        "context.prune_protect_turns", "int", 2,
        "The newest this many turns keep their tool output (a file read, a command's "
        "result) for the model; in older turns the model sees '[Tool output cleared]' "
        "instead (your history keeps it). When they do not fit, fewer turns keep it.",
        minimum=0, maximum=100, unit="turns",
        label="Recent turns whose tool output is kept",
    ),
    Setting(
        "context.compaction_min_turns", "int", 20,
        "Also summarize older turns once this many turns are not yet summarized, however "
        "few tokens they take (0 = never by count).",
        minimum=0, maximum=10_000, unit="turns",
        label="Summarize after this many turns",
    ),
    Setting(
        "context.keep_recent_ratio", "float", 0.5,
        "After a summary, the newest turns stay word for word up to this share of the red "
        "line's tokens (the window × \"When older turns are summarized\"); the rest goes "
        "into the summary. The newest turn always stays.",
        minimum=0.05, maximum=0.95, unit="× red line",
        label="How much recent history stays word for word",
    ),
    Setting(
        "context.summary_max_tokens", "int", 768,
        "Cap on the tokens of a generated summary.",
        minimum=64, maximum=8192, unit="tokens",
        label="Longest summary",
    ),
    Setting(
        "context.summarizer", "choice", AUTO,
        "Who writes the summary when old turns are compacted: auto (the model, unless it is "
        "a base model that cannot follow instructions), model, or extractive (Iris's own "
        "deterministic summary of names, dates, numbers and files: fast, no model call).",
        choices=(AUTO, "model", "extractive"),
        label="Who writes the summary",
    ),
    Setting(
        "context.summary_timeout_s", "int", 180,
        "Longest time the model may take for one summary call; after it (or when you press "
        "Stop) the extractive summary is used, so the context still shrinks. A long imported "
        "chat is summarized in parts, each with this time.",
        minimum=10, maximum=3600, unit="seconds",
        label="Time limit for one summary",
    ),
    Setting(
        "context.summary_max_parts", "int", 2,
        "The model summarizes at most this many parts of old turns at once (a part is "
        "about one window of text, one model call each); older turns, as in a long "
        "imported chat's first summary, get the extractive summary instead, so a question "
        "waits minutes, not hours. Recall still finds every message (0 = no limit).",
        minimum=0, maximum=1000, unit="parts",
        label="Parts the model summarizes at once",
    ),
    Setting(
        "context.recall_max_tokens", "int", 1536,
        "Tokens for recall: when your newest message asks something, earlier messages that a "
        "summary replaced, found by its words and by its meaning and shown to the model with "
        "it, dated. Recall only uses space the verbatim history leaves free. Each block is new "
        "to the model, so a question takes longer to start answering: on a slow CPU a "
        "smaller value answers sooner (0 = off).",
        minimum=0, maximum=8192, unit="tokens",
        label="Room for recalled messages",
    ),
    Setting(
        "context.recall_semantic", "bool", True,
        "Recall also by meaning: a small embedding model (context.recall_embedder, shipped "
        "with Iris) finds earlier messages that answer your question in other words ('what "
        "pets does she have?' finds 'we adopted a kitten'). Off: recall matches words only.",
        label="Recall by meaning, not only by words",
    ),
    Setting(
        "context.recall_embedder", "choice", "bge-small",
        "The embedding model for recall by meaning: bge-small (BAAI/bge-small-en-v1.5) or "
        "minilm (all-MiniLM-L6-v2), both shipped with Iris. bge-small finds more of what a "
        "question asks for on both dev sets (docs/benchmarks.md) and embeds a message as fast. "
        "Changing it re-embeds your chats in the background; recall searches the old vectors "
        "until the new ones are complete.",
        choices=("minilm", "bge-small"), needs_reload=True,
        label="Embedding model for recall",
    ),
    Setting(
        "context.recall_rerank", "bool", True,
        "Rerank recall's candidates: a small cross-encoder (ms-marco-MiniLM-L-12-v2, shipped "
        "with Iris) reads your question with each of the best few dozen earlier messages and "
        "puts those that answer it first. One to three seconds per question on a busy two-core "
        "CPU, spent while you type when you pause. Off: recall keeps the order of words and "
        "meaning alone.",
        label="Rerank recalled messages",
    ),
    Setting(
        "context.token_counter", "choice", AUTO,
        "How tokens are counted: auto (the model's own tokenizer when a model is loaded, "
        "else the estimate), model (the model's own tokenizer), tiktoken (OpenAI's "
        "tokenizer cl100k_base, offline), heuristic (an estimate from the text's length, "
        "about 4 characters a token; counts tool output about 20% short).",
        choices=(AUTO, "model", "tiktoken", "heuristic"),
        label="How tokens are counted",
    ),
    # -- model -----------------------------------------------------------------------------
    Setting(
        "model.backend", "choice", "local",
        "Where the model runs: local (the GGUF in model.path, in this process, offline) or "
        "openai (an OpenAI-compatible server at model.base_url: llama.cpp server, vLLM, "
        "Ollama). The API key, if the server needs one, is kept in the OS keyring.",
        choices=("local", "openai"), needs_reload=True,
        label="Where the model runs",
    ),
    Setting(
        "model.base_url", "url", "",
        "The server's address when model.backend is openai, for example "
        "http://127.0.0.1:8080/v1. Your conversation is sent there.",
        needs_reload=True,
        label="Server address",
    ),
    Setting(
        "model.name", "str", "",
        "The model to use on the server (empty: the first it serves).",
        needs_reload=True,
        label="Model on the server",
    ),
    Setting(
        "model.path", "path", BUNDLED,
        "GGUF model file. 'bundled' is Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, Apache-2.0), "
        "which ships with Iris and works offline.",
        needs_reload=True,
        label="Model file",
    ),
    Setting(
        "model.n_ctx", "int", 8192,
        "llama.cpp context size in tokens; 0 = the model's trained maximum.",
        minimum=512, maximum=1_048_576, unit="tokens", needs_reload=True,
        label="Model context size", zero_means="the model's trained maximum",
    ),
    Setting(
        "model.kv_cache_mb", "int", 1024,
        "Disk space for each chat's evaluated prompt (the model's KV state), saved when you "
        "leave a chat or quit and restored when you come back, so a long chat starts at "
        "once; the least recently used go first (0 = off).",
        minimum=0, maximum=65_536, unit="MB",
        label="Disk space for resuming chats at once",
    ),
    Setting(
        "model.temperature", "float", 0.7,
        "Sampling temperature; 0 is greedy.",
        minimum=0.0, maximum=2.0,
        label="Creativity (temperature)",
    ),
    Setting(
        "model.repeat_penalty", "float", 1.1,
        "How much a word already said in the last 64 tokens is held back (1 = not at all); "
        "small models loop without it.",
        minimum=1.0, maximum=2.0,
        label="Penalty for repeating itself",
    ),
    Setting(
        "model.dry_multiplier", "float", 0.8,
        "Hold back a passage the reply already wrote, more the longer the repeat runs "
        "(llama.cpp's DRY sampler; 0 = off; the local model only: a server would apply it "
        "to the question too and garble what the reply copies from it).",
        minimum=0.0, maximum=5.0,
        label="Penalty for repeating a passage",
    ),
    Setting(
        "model.top_p", "float", 0.95,
        "Sample only from the likeliest words that together make up this share of the "
        "probability (1 = all).",
        minimum=0.01, maximum=1.0,
        label="Top-p (nucleus sampling)",
    ),
    Setting(
        "model.top_k", "int", 40,
        "Sample only from this many likeliest words (0 = all; a server may ignore it).",
        minimum=0, maximum=1000, unit="words",
        label="Top-k",
    ),
    Setting(
        "model.min_p", "float", 0.05,
        "Leave out words less likely than this share of the likeliest one's probability "
        "(0 = none; a server may ignore it).",
        minimum=0.0, maximum=1.0,
        label="Min-p",
    ),
    Setting(
        "model.max_tokens", "int", 1024,
        "Maximum tokens generated for one reply.",
        minimum=1, maximum=32_768, unit="tokens",
        label="Longest reply",
    ),
    Setting(
        "model.stream_idle_timeout_s", "int", 60,
        "A server's reply ends, with a note, when no new text arrives for this long "
        "(keep-alives do not count); what arrived is kept.",
        minimum=5, maximum=3600, unit="s", needs_reload=True,
        label="Give up on a silent server after",
    ),
    Setting(
        "model.kv_shift", "bool", False,
        "After a compaction, keep the part of the chat that stayed word for word in the "
        "model's cache and move it, instead of reading it again: the next message starts "
        "sooner. Not exact: those words were read with the old summary before them, so "
        "replies differ from those after a full re-read, often from the first words "
        "(local model only).",
        needs_reload=True,
        label="Reuse the cache after a compaction",
    ),
    Setting(
        "model.n_threads", "int", 0,
        "CPU threads for llama.cpp, for reading the prompt and for writing the reply; "
        "0 = automatic: the physical cores Iris may use.",
        minimum=0, maximum=256, unit="threads", needs_reload=True,
        label="CPU threads",
    ),
    Setting(
        "model.flash_attn", "bool", True,
        "Flash attention: llama.cpp computes attention in tiles, which reads long prompts "
        "faster. Replies can differ from those without it in rare near-ties; turn it off if "
        "a model misbehaves with it. A chat's cache saved with the other choice is read again.",
        needs_reload=True,
        label="Flash attention",
    ),
    Setting(
        "model.q8_weights", "bool", True,
        "Read the model's 5-bit (Q5_0) weights as 8-bit (Q8_0): the same values, so the "
        "same replies, and prompts are read about 25% faster on CPUs. The 8-bit copy is "
        "written once into the data folder (the bundled model: 637 MB, ~3 s) and uses that "
        "much memory instead of the file's; models without Q5_0 weights, with GPU layers, "
        "or whose copy would not leave 2 GB of this computer's memory free are loaded as "
        "they are.",
        needs_reload=True,
        label="Faster prompt reading (8-bit copy of 5-bit weights)",
    ),
    Setting(
        "model.gpu", "gpu", AUTO,
        "Run the model on a graphics card (GPU). auto: a discrete GPU if there is one (an "
        "integrated one only on a Mac), with as many layers as fit in its free memory beside "
        "the context cache, the rest on the CPU; a GPU whose answers differ from the CPU's "
        "in Iris's first-use check is left off. off: the CPU only, no GPU memory at all. A "
        "number: that many layers on the GPU, an integrated one too (more than the model "
        "has: all of them). 'iris-desktop devices' shows what llama.cpp found and the plan.",
        minimum=1, maximum=1000, unit="layers", needs_reload=True,
        label="Use the graphics card (GPU)",
    ),
    # -- models (downloads) -----------------------------------------------------------------
    Setting(
        "models.hub_url", "url", "https://huggingface.co",
        "Where Model ▸ Download… and 'iris-desktop models search/download' look for GGUF "
        "models. Contacted only when you search or download; nothing else is sent.",
        label="Model hub address",
    ),
    # -- tools -----------------------------------------------------------------------------
    Setting(
        "tools.enabled", "list", ["read_file", "list_directory", "search_files"],
        "Tools the model may call. The file tools stay off until a folder is in "
        "tools.allowed_paths (below): until then the model is offered none of them.",
        item_choices=TOOL_CHOICES,
        label="Tools the model may use",
    ),
    Setting(
        "tools.allowed_paths", "list", [],
        "Folders the tools may read. Nothing is allowed until you add a folder.",
        label="Folders the tools may read", folders=True,
    ),
    Setting(
        "tools.shell", "bool", False,
        "Allow run_shell; add it to tools.enabled too (the model is offered only the tools "
        "listed there). Every command still needs your confirmation.",
        label="Allow shell commands",
    ),
    Setting(
        "tools.shell_timeout_s", "int", 60,
        "Longest time one shell command (run_shell) may run; after it the command and "
        "everything it started are stopped, and what it wrote so far is kept.",
        minimum=1, maximum=3600, unit="seconds",
        label="Time limit for a shell command",
    ),
    Setting(
        "tools.max_calls_per_turn", "int", 8,
        "Maximum tool calls the model may make in one turn.",
        minimum=0, maximum=64, unit="calls",
        label="Tool calls per turn",
    ),
    # -- chat ------------------------------------------------------------------------------
    Setting(
        "chat.system_prompt", "str",
        "You are Iris, a helpful assistant running locally and offline on the user's computer.",
        "System prompt sent at the start of every request (unless the thread has its own). "
        "{{CURRENT_DATE}}, {{CURRENT_TIME}}, {{CURRENT_DATETIME}}, {{CURRENT_WEEKDAY}} and "
        "{{CURRENT_TIMEZONE}} are filled in when it is sent (a time changes the prompt every "
        "request, so the model reads the whole chat again each turn).",
        multiline=True,
        label="Instructions for every chat (system prompt)",
    ),
    # -- storage ---------------------------------------------------------------------------
    Setting(
        "storage.encrypt", "bool", False,
        "Keep the chat history encrypted on disk (SQLCipher). The key is kept in the "
        "computer's keyring, or derived from a passphrase asked at start "
        "(IRIS_STORAGE_PASSPHRASE supplies it without asking). Turning it on or off "
        "converts the database at the next start, verified before the old file is removed; "
        "left unset, an encrypted history stays encrypted.",
        label="Encrypt the chat history on disk", at_start=True,
    ),
    # -- ui --------------------------------------------------------------------------------
    Setting(
        "ui.theme", "choice", "system",
        "Colours of the window: system (follow the computer's light or dark setting), "
        "light, or dark. Applies at once.",
        choices=("system", "light", "dark"),
        label="Theme",
    ),
    Setting(
        "ui.font_size", "int", 0,
        "Size of the text in the window, in points; 0 uses the computer's size. Applies "
        "at once.",
        minimum=8, maximum=24, unit="pt", zero_means="the system's size",
        label="Text size",
    ),
)

SETTINGS: dict[str, Setting] = {s.key: s for s in _ALL}


def lookup(key: str) -> Setting:
    try:
        return SETTINGS[key]
    except KeyError:
        if key in RENAMED:
            new = RENAMED[key][0]
            raise SettingsError(f"{key} is now {new} ({SETTINGS[new].describe_allowed()}); "
                                f"use {new}") from None
        near = _near_key(key)
        hint = f"; did you mean {near}?" if near else ""
        raise SettingsError(f"unknown setting {_shown(key)}{hint} (see 'iris-desktop config list')") from None


def _near_key(key: str) -> str | None:
    """The setting ``key`` was probably meant to be: the same in another case or with
    underscores, the same last part, or a typo of one (context.windw), as the
    environment's names are suggested."""
    import difflib

    folded = key.strip().lower().replace("-", "_")
    close = [k for k in SETTINGS if k == folded or k.replace(".", "_") == folded
             or k.split(".")[-1] == folded.split(".")[-1]]
    close = close or difflib.get_close_matches(folded, list(SETTINGS), n=1, cutoff=0.85)
    return close[0] if close else None


#: how a problem ends for a key of the settings file that this Iris has not (a newer
#: Iris's): the window logs it rather than ask the user on every start
NOT_KNOWN = "is not known to this version of Iris; ignored"


SOURCES = ("default", "file", "env", "cli")


def _from_n_gpu_layers(raw: Any) -> Any:
    """model.n_gpu_layers (0 = CPU only, -1 = all) as model.gpu."""
    try:
        value = int(raw.strip()) if isinstance(raw, str) else raw
    except ValueError:  # not Python's "invalid literal for int() with base 10"
        value = None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SettingsError(f"model.n_gpu_layers: invalid value {_shown(raw)}: expected an integer")
    if value < 0:  # all of them
        return int(SETTINGS["model.gpu"].maximum or 1000)
    return SETTINGS["model.gpu"].parse(value)


#: keys an older Iris wrote, and how their values are read now: old key -> (new key, convert)
RENAMED: dict[str, tuple[str, Any]] = {
    "model.n_gpu_layers": ("model.gpu", _from_n_gpu_layers),
}

#: ADR-0079's environment variables. Iris does not read them (every key has one name, the
#: same in the file, the environment and the CLI); a problem says what to use instead.
FOREIGN_ENV = {
    "IRIS_COMPACTION_THRESHOLD": "IRIS_CONTEXT_COMPACTION_MIN_TURNS (the count floor: "
    "compact once this many unsummarized turns exist)",
    "IRIS_COMPACTION_RATIO": "IRIS_CONTEXT_COMPACTION_THRESHOLD (compact when the last "
    "prompt reaches this fraction of the window)",
    "IRIS_COMPACTION_TOKEN_BUDGET": "IRIS_CONTEXT_TOKEN_BUDGET_RATIO (the budget is a "
    "fraction of the window, not a token count: B tokens of a W-token window is B/W)",
    "IRIS_COMPACTION_KEEP_RECENT": "IRIS_CONTEXT_KEEP_RECENT_RATIO (the verbatim tail after "
    "compaction, a fraction of the trigger tokens; at least one turn is always kept)",
}

#: names people guess for the data folder's variable, IRIS_HOME: not read, and said so (they
#: were ignored without a word, and Iris used the platform's folder)
DATA_DIR_GUESSES = ("IRIS_DATA_DIR", "IRIS_DATA", "IRIS_DIR", "IRIS_DATADIR", "IRIS_DATA_HOME",
                    "IRIS_DATA_PATH", "IRIS_CONFIG_DIR", "IRIS_CONFIG_HOME", "IRIS_DESKTOP_HOME")


def data_dir_guesses(env: Mapping[str, str]) -> list[str]:
    """A problem for each variable of ``env`` that guesses IRIS_HOME's name (any case)."""
    return [f"environment {name} is not read; the data folder is set by IRIS_HOME (or --data-dir)"
            for name in sorted(env) if name.upper() in DATA_DIR_GUESSES]


@dataclass
class Settings:
    """Resolved values, where each came from, and the problems met on the way."""

    values: dict[str, Any]
    sources: dict[str, str]
    problems: list[str] = field(default_factory=list)
    config_path: Path | None = None
    #: why the settings file could not be used at all (its values are not in these)
    file_unreadable: str | None = None

    def __getitem__(self, key: str) -> Any:
        lookup(key)
        return self.values[key]

    def get(self, key: str) -> Any:
        return self[key]

    def source(self, key: str) -> str:
        return self.sources[key]

    def with_overrides(self, overrides: Mapping[str, Any]) -> Settings:
        """A copy with validated overrides applied (source 'cli'); raises SettingsError."""
        values = dict(self.values)
        sources = dict(self.sources)
        for key, raw in overrides.items():
            values[key] = lookup(key).parse(raw)
            sources[key] = "cli"
        return Settings(values, sources, list(self.problems), self.config_path, self.file_unreadable)


def defaults() -> Settings:
    return Settings(
        {k: _copy(s.default) for k, s in SETTINGS.items()}, {k: "default" for k in SETTINGS}
    )


def _copy(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


def flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"context": {"window": 1}}`` → ``{"context.window": 1}``."""
    flat: dict[str, Any] = {}
    for name, value in table.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict):
            flat.update(flatten(value, key + "."))
        else:
            flat[key] = value
    return flat


#: a settings file is a few hundred bytes; one larger than this is not read at all
MAX_CONFIG_BYTES = 1 << 20
#: tables, lists and dotted keys nest at most this deep (Iris's own keys use two levels):
#: deeper nesting makes TOML parsers recurse past Python's limit or take quadratic time
MAX_CONFIG_DEPTH = 32


class ConfigFileError(ValueError):
    """The settings file cannot be used; the message says why, as a clause ("it is a
    named pipe (FIFO), not a regular file")."""


def read_config_bytes(path: Path, limit: int = MAX_CONFIG_BYTES) -> bytes | None:
    """The settings file's bytes, or None when there is none. Never blocks and never
    reads more than ``limit`` + 1 bytes: the file is opened non-blocking (a FIFO or a
    device is refused, not waited on) and must be a regular file of at most ``limit``
    bytes. Raises ConfigFileError."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) \
        | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:  # permissions, a socket (ENXIO), a loop of links
        raise ConfigFileError(f"it cannot be opened ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigFileError(f"it is {file_kind(info.st_mode)}, not a regular file")
        if info.st_size > limit:
            raise ConfigFileError(_too_large(info.st_size, limit))
        chunks: list[bytes] = []
        size = 0
        while size <= limit:  # the file may grow while it is read: never past limit + 1
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise ConfigFileError(_too_large(None, limit))
        return b"".join(chunks)
    except OSError as exc:
        raise ConfigFileError(f"it cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _too_large(size: int | None, limit: int) -> str:
    known = f" ({size:,} bytes)" if size is not None else ""
    return f"it is larger{known} than the {limit:,} bytes a settings file may have"


# what TOML nests with outside strings and comments: brackets, braces and the dots of a
# dotted key (``a.b."c"``); a string or a comment is skipped whole
_TOML_SPECIAL = re.compile(r"[\[\]{}=,\n.#\"']")
_BASIC_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"?')
_LITERAL_STRING = re.compile(r"'[^'\n]*'?")


def check_toml_depth(text: str, limit: int = MAX_CONFIG_DEPTH) -> None:
    """Raise ConfigFileError when ``text`` nests tables, lists or dotted keys more than
    ``limit`` levels deep. One linear scan, before any parser sees the text: Python's
    TOML parsers recurse once per level (a RecursionError) and take quadratic time and
    memory on a long dotted key."""
    depth = dots = pos = 0
    while (match := _TOML_SPECIAL.search(text, pos)) is not None:
        char, at = match.group(), match.start()
        pos = at + 1
        if char == "#":  # a comment: up to its newline, which ends what came before
            end = text.find("\n", at)
            pos = len(text) if end < 0 else end
        elif char in "\"'":  # a string, a quoted part of a dotted key among them
            pos = _string_end(text, at, char)
        elif char == ".":
            dots += 1
            if dots >= limit:
                break
        else:
            dots = 0  # a dotted key ends here
            if char in "[{":
                depth += 1
                if depth > limit:
                    break
            elif char in "]}":
                depth = max(depth - 1, 0)
    else:
        return
    raise ConfigFileError(f"it nests tables, lists or dotted keys more than {limit} levels "
                          "deep (Iris's settings use two: a [section] and its keys)")


def _string_end(text: str, at: int, quote: str) -> int:
    """Where the TOML string that opens at ``at`` ends (past its closing quotes); an
    unterminated one ends at its line's end (one line) or the text's (multi-line)."""
    triple = quote * 3
    if not text.startswith(triple, at):
        return (_BASIC_STRING if quote == '"' else _LITERAL_STRING).match(text, at).end()
    pos = at + 3
    while (close := text.find(triple, pos)) >= 0:
        backslashes = 0
        while quote == '"' and text[close - 1 - backslashes] == "\\":
            backslashes += 1
        if backslashes % 2 == 0:
            return close + 3
        pos = close + 1
    return len(text)


def parse_config_text(data: bytes) -> dict[str, Any]:
    """The TOML document in ``data``, parsed after the checks of ``check_toml_depth``.
    Raises ConfigFileError saying what is wrong."""
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")  # "UTF-8 with BOM" (Notepad)
    except UnicodeDecodeError as exc:
        raise ConfigFileError(f"it is not UTF-8 text (byte {exc.start})") from None
    check_toml_depth(text)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"it is not valid TOML ({exc})") from None
    except RecursionError:  # check_toml_depth keeps far below the limit: a last guard
        raise ConfigFileError("it nests tables or lists too deeply") from None
    except ValueError:  # Python's limit on digits: an integer of 5,000 digits crashed every start
        raise ConfigFileError(f"it holds a number of more than {sys.get_int_max_str_digits():,} "
                              "digits, which no setting takes") from None


def read_config_file(path: Path) -> tuple[dict[str, Any], str | None]:
    """Raw key → value pairs from a TOML file, or why it cannot be used at all ("PATH:
    cannot read the settings file: …"). Never raises and never blocks
    (``read_config_bytes``)."""
    try:
        data = read_config_bytes(path)
        if data is None:
            return {}, None
        return flatten(parse_config_text(data)), None
    except ConfigFileError as exc:
        return {}, f"{path}: cannot read the settings file: {exc}"


def load_settings(
    config_path: Path | None,
    env: Mapping[str, str] | None = None,
    cli: Mapping[str, str] | None = None,
) -> Settings:
    """Layer defaults < file < environment < CLI.

    Bad file or environment values are reported and skipped. Bad CLI values raise
    :class:`SettingsError`, because the user typed them just now.
    """
    env = os.environ if env is None else env
    settings = defaults()
    settings.config_path = config_path
    if config_path is not None:
        raw, settings.file_unreadable = read_config_file(config_path)
        if settings.file_unreadable is not None:
            settings.problems.append(f"{settings.file_unreadable}; using the defaults (fix it, "
                                     "or remove it)")
        for key, value in raw.items():
            if key in RENAMED:
                continue
            if key not in SETTINGS:  # a newer Iris's key (or a typo): it has no default
                near = _near_key(key)
                settings.problems.append(f"{config_path}: {key} {NOT_KNOWN}"
                                         + (f" (did you mean {near}?)" if near else ""))
                continue
            try:
                settings.values[key] = lookup(key).parse(value)
                settings.sources[key] = "file"
            except SettingsError as exc:
                settings.problems.append(f"{config_path}: {exc}; using the default")
        _read_renamed(settings, raw, "file", f"{config_path}: ")
    for key, setting in SETTINGS.items():
        if setting.env_var in env:
            try:
                settings.values[key] = setting.parse(env[setting.env_var])
                settings.sources[key] = "env"
            except SettingsError as exc:  # the layer below is used: the file's value or the default
                below = "the settings file's value" if settings.sources[key] == "file" else "the default"
                settings.problems.append(f"environment {setting.env_var}: {exc}; ignored, {below} "
                                         "is used")
    _read_renamed(settings, {old: env[_env_name(old)] for old in RENAMED if _env_name(old) in env},
                  "env", "environment ")
    for name, instead in FOREIGN_ENV.items():
        if name in env:
            settings.problems.append(f"environment {name} is ADR-0079's name and is not "
                                     f"read; use {instead}")
    settings.problems.extend(_unknown_env(env))
    settings.problems.extend(data_dir_guesses(env))
    if cli:
        settings = settings.with_overrides(cli)
    return settings


#: IRIS_ variables that are not settings (where the data lives, the history's passphrase)
OTHER_ENV = ("IRIS_HOME", "IRIS_WEIGHTS_DIR", "IRIS_STORAGE_PASSPHRASE")
#: keys whose absence means something other than their default, so that a value equal to
#: the default is written, not removed, and Restore defaults leaves them: storage.encrypt
#: unset follows the history (an encrypted one stays so); false decrypts it
PINNED = frozenset({"storage.encrypt"})


def _unknown_env(env: Mapping[str, str]) -> list[str]:
    """A problem for each environment variable that looks like a setting's and is none (a
    typo, a key in lower case): it would be ignored without a word. Only names in a
    settings section (IRIS_CONTEXT_…, IRIS_MODEL_…) are judged: build and test scripts
    have IRIS_ variables of their own."""
    import difflib

    known = {s.env_var for s in SETTINGS.values()} | {_env_name(old) for old in RENAMED}
    known |= set(FOREIGN_ENV) | set(OTHER_ENV)
    sections = {"IRIS_" + key.split(".")[0].upper() + "_" for key in SETTINGS}
    problems = []
    for name in sorted(env):
        upper = name.upper()
        if name in known or not upper.startswith(tuple(sections)):
            continue
        if upper in known:
            problems.append(f"environment {name} is not read: its name is {upper}")
            continue
        near = difflib.get_close_matches(upper, sorted(known), n=1, cutoff=0.85)
        problems.append(f"environment {name} is not a setting Iris knows; ignored"
                        + (f" (did you mean {near[0]}?)" if near else ""))
    return problems


def _env_name(key: str) -> str:
    return "IRIS_" + key.upper().replace(".", "_")


def _read_renamed(settings: Settings, raw: Mapping[str, Any], source: str, where: str) -> None:
    """An older Iris's keys (``RENAMED``) read as their new ones, when the new one is not
    set in the same place; a problem says so, and how to write the new key."""
    for old, value in raw.items():
        if old not in RENAMED:
            continue
        new, convert = RENAMED[old]
        shown = _env_name(old) if source == "env" else old
        if settings.sources.get(new) == source:
            settings.problems.append(f"{where}{shown} is an older Iris's name for {new}, which is "
                                     f"set too; {shown} is ignored (remove it)")
            continue
        try:
            settings.values[new] = convert(value)
        except (SettingsError, ValueError) as exc:
            settings.problems.append(f"{where}{shown} (now {new}): {exc}; using the default")
            continue
        settings.sources[new] = source
        text = SETTINGS[new].to_text(settings.values[new])
        fix = (f"'iris-desktop config set {new} {text}' rewrites it" if source == "file"
               else f"set {_env_name(new)}={text} instead")
        settings.problems.append(f"{where}{shown} = {value!r} is read as {new} = {text} (the key "
                                 f"was renamed; {fix})")


def parse_assignments(items: Iterable[str]) -> dict[str, str]:
    """``["a.b=1", ...]`` → ``{"a.b": "1"}``; raises SettingsError on a malformed item."""
    result: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SettingsError(f"--set expects KEY=VALUE, got {item!r}")
        lookup(key.strip())
        result[key.strip()] = value
    return result


def write_config_value(path: Path, key: str, raw: Any | None) -> Any:
    """Set (or, with ``raw=None``, remove) one key in the TOML file, atomically.

    The value is validated first: on error nothing is written. The file is edited in
    place: comments, order and other keys (even invalid ones) stay as written. Returns
    the parsed value. Raises SettingsError for a file that cannot be read or edited.
    """
    return write_config_values(path, {key: raw})[key]


def write_config_values(path: Path, changes: Mapping[str, Any | None]) -> dict[str, Any]:
    """:func:`write_config_value` for several keys at once, all or none: every value is
    validated and every edit made on the document before the file is written, once
    (Preferences' OK wrote key by key, and a file one key could not go into kept the
    keys before it). Two writers at once take turns: each reads the file the other wrote
    (two `config set` at once lost one key, both saying it was saved). A file that is a
    link is written where it leads. Returns the parsed values."""
    values = {key: None if raw is None else lookup(key).parse(raw) for key, raw in changes.items()}
    for key, value in values.items():
        _check_utf8(key, value)
    path = Path(os.path.realpath(path))  # a dotfile linked here stays a link
    with _turn(path):
        document = _read_document(path)
        for key, value in values.items():
            section, name = key.split(".", 1)
            table = document.get(section)
            if table is not None and not isinstance(table, dict):
                raise SettingsError(f"{path}: {section} is a value, not a [{section}] table; fix or "
                                    "remove that line before 'config set' or 'config reset'")
            if value is None:
                if table is not None:
                    table.pop(name, None)
                    if len(table) == 0 and "#" not in table.as_string():  # (a comment stays)
                        del document[section]  # no empty [section] left behind
            elif table is None:
                document[section] = table = {name: value}
            else:
                table[name] = value
            for old, (renamed_to, _) in RENAMED.items():  # the older name of this key goes too
                if renamed_to == key and old.split(".", 1)[0] == section and table is not None:
                    table.pop(old.split(".", 1)[1], None)
        data = tomlkit.dumps(document).encode("utf-8")
        if len(data) > MAX_CONFIG_BYTES:  # a file Iris would then refuse to read at all
            longest = max(values, key=lambda k: len(str(values[k] or "")))
            raise SettingsError(f"{path}: the settings file would be {len(data):,} bytes, more "
                                f"than the {MAX_CONFIG_BYTES:,} Iris reads; {longest} is the "
                                "longest value: shorten it (nothing was saved)")
        atomic_write_bytes(path, data)
    return values


def _check_utf8(key: str, value: Any) -> None:
    """SettingsError for a value the UTF-8 settings file cannot hold: a file name in
    another encoding (it was "unexpected error (UnicodeEncodeError)")."""
    for text in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise SettingsError(f"{key}: {text.encode('utf-8', 'backslashreplace').decode()!r} "
                                    "holds bytes that are not UTF-8 (a file name in another "
                                    "encoding), which the settings file cannot hold; rename it, "
                                    f"or give it with --set or {lookup(key).env_var}") from None


@contextmanager
def _turn(path: Path) -> Iterator[None]:
    """One writer of the settings file at a time, across processes."""
    make_private_dir(path.parent)
    try:
        with exclusive_lock(path.with_name(f".{path.name}.lock"), wait=True):
            yield
    except DataDirError:
        raise
    except OSError as exc:
        raise DataDirError(f"cannot write {path} ({exc.strerror or exc}); make its folder "
                           "writable or choose another --data-dir (or IRIS_HOME)") from None


def _read_document(path: Path) -> tomlkit.TOMLDocument:
    """The settings file as an editable document (empty when there is none), read with
    the same limits as loading (``read_config_bytes``, ``parse_config_text``)."""
    fix = "fix or remove it before 'config set' or 'config reset'"
    try:
        data = read_config_bytes(path)
        if data is None:  # writing says what is wrong with the folder
            return tomlkit.document()
        parse_config_text(data)  # bounded: tomlkit is slower and recurses just the same
        return tomlkit.parse(data.decode("utf-8").removeprefix("\ufeff"))
    except ConfigFileError as exc:
        raise SettingsError(f"cannot use {path}: {exc}; {fix}") from None
    except (TOMLKitError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise SettingsError(f"cannot use {path}: it is not valid TOML ({reason}); {fix}") from None


def reset_config(path: Path, key: str | None = None) -> None:
    if key is not None:
        if os.path.lexists(path):  # (none there: nothing to remove, none is made)
            write_config_value(path, key, None)
        return
    path = Path(os.path.realpath(path))
    try:
        mode = os.stat(path).st_mode
    except OSError:  # none there (or none reachable: writing says why)
        mode = None
    if mode is not None and not stat.S_ISREG(mode):  # never replaced behind the user's back
        raise SettingsError(f"cannot use {path}: it is {file_kind(mode)}, not a regular file; "
                            "fix or remove it before 'config set' or 'config reset'")
    if mode is not None:
        with _turn(path):
            atomic_write_bytes(path, b"")


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write via a temp file + fsync + rename, so a crash never leaves a half-written file.
    A missing folder is created private (0700). Raises DataDirError saying what to do."""
    make_private_dir(path.parent)
    try:
        atomic_write(path, data, mode=mode)
    except OSError as exc:
        raise DataDirError(f"cannot write {path} ({exc.strerror or exc}); make its folder "
                           "writable or choose another --data-dir (or IRIS_HOME)") from None
