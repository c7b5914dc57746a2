"""What a server is, probed without sending anything of a conversation: its kind
(llama.cpp, vLLM, Ollama, any other OpenAI-compatible API), the models it serves with
the windows it runs them with, and whether it counts prompts exactly (the module
docstring of ``runtime.remote`` says which field each server's window comes from)."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass

from iris_desktop.tokens import Message

from ..errors import ServerError
from .address import server_address
from .deadline import OnWait, connect_clock
from .transport import REQUEST_TIMEOUT_S, _Http, _obj, _whole, server_said

log = logging.getLogger("iris.runtime.remote")

#: probe messages for measuring what one message or the tools add to a prompt
_PROBE_SYSTEM: Message = {"role": "system", "content": "."}
_PROBE_USER: Message = {"role": "user", "content": "."}


@dataclass(frozen=True)
class ServerModel:
    """A model a server offers. ``context_length``: the window the server runs it with,
    when the server says (None: it does not); ``trained_length``: what the model was
    trained for (information only)."""

    name: str
    context_length: int | None = None
    trained_length: int | None = None


@dataclass(frozen=True)
class ServerInfo:
    """What :func:`test_connection` learned. ``kind``: ``llama.cpp`` | ``vllm`` |
    ``ollama`` | ``openai`` (any other OpenAI-compatible server); ``counting``:
    ``input_tokens`` | ``apply-template`` | ``vllm-tokenize`` (exact) or ``estimated``."""

    base_url: str
    kind: str
    models: tuple[ServerModel, ...]
    counting: str
    #: what identifies the tokenizer and template besides the model's name (llama.cpp:
    #: a hash of its chat template and model meta), so that another GGUF served under
    #: the same name gets another counter name; "" when the server says nothing of it
    fingerprint: str = ""

    @property
    def exact_counts(self) -> bool:
        return self.counting != "estimated"

    def model(self, name: str) -> ServerModel | None:
        """The model ``name`` is served as; llama.cpp serves its one model whatever the
        request names."""
        for entry in self.models:
            if entry.name == name:
                return entry
        return self.models[0] if self.kind == "llama.cpp" and self.models else None

    def describe(self) -> list[str]:
        """Lines for the "Test connection" result: the first :data:`DESCRIBED_MODELS`
        models, then how many more (a server listing 100,000 froze the dialog for 9 s
        drawing a label of 5 million characters)."""
        counts = ("exact (the server's tokenizer and template)" if self.exact_counts
                  else "estimated (tiktoken, calibrated from what the server reports)")
        lines = [f"{self.kind} server at {server_address(self.base_url)}; counts: {counts}"]
        for m in self.models[:DESCRIBED_MODELS]:
            window = (f"{m.context_length:,} tokens" if m.context_length
                      else "window not reported (context.window is used)")
            trained = f", trained for {m.trained_length:,}" if m.trained_length else ""
            lines.append(f"  {server_said(m.name)}: {window}{trained}")
        if len(self.models) > DESCRIBED_MODELS:
            lines.append(f"  and {len(self.models) - DESCRIBED_MODELS:,} more models")
        return lines


#: the most models the "Test connection" result lists by name
DESCRIBED_MODELS = 20


def test_connection(base_url: str, api_key: str | None = None, *,
                    answer_limit_bytes: int | None = None,
                    answer_timeout_s: float = REQUEST_TIMEOUT_S,
                    deadline_s: float | None = None, on_wait: OnWait | None = None) -> ServerInfo:
    """Probe ``base_url``: what kind of server it is, the models it offers with their
    windows, and whether it can count prompts exactly. Sends nothing of a conversation.
    Each answer is bounded as :class:`_Http` says (``answer_limit_bytes``,
    ``answer_timeout_s``), all of them together by ``deadline_s`` (None:
    :data:`~.deadline.CONNECT_DEADLINE_S`); ``on_wait(path, seconds)`` hears what a slow
    probe waits for. Raises ServerError (unreachable, key refused, an answer too large or
    too slow, the deadline passed) or ValueError (not a URL)."""
    http = _Http(base_url, api_key, answer_limit=answer_limit_bytes,
                 answer_timeout_s=answer_timeout_s)
    http.clock = connect_clock(http.root, deadline_s, on_wait)
    try:
        return _probe(http, base_url)
    finally:
        http.close()


def _probe(http: _Http, base_url: str, only: str | None = None) -> ServerInfo:
    """ServerInfo for the server behind ``http``; ``only``: look up just this model's
    window (Ollama asks once per model)."""
    props = http.get("/props", missing_ok=True)
    listed = http.get("/v1/models", missing_ok=True)
    listed = listed if isinstance(listed, dict) else {}
    data = _named(listed.get("data"), http.address)
    if isinstance(props, dict) and "default_generation_settings" in props:
        identity = [props.get("chat_template"), data[0].get("meta") if data else None]
        fingerprint = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
        return ServerInfo(base_url, "llama.cpp", _llama_cpp_models(props, data),
                          _llama_cpp_counting(http), fingerprint[:12])
    if props is None and http.get("/api/version", missing_ok=True) is not None:
        names = [only] if only else [d["id"] for d in data]
        return ServerInfo(base_url, "ollama", _ollama_models(http, names), "estimated")
    if not listed:
        raise ServerError(f"{http.address}: no OpenAI-compatible API here (GET /v1/models "
                          f"found nothing)")
    models = tuple(ServerModel(d["id"], _context_field(d)) for d in data)
    if any(d.get("owned_by") == "vllm" for d in data):
        counting = "vllm-tokenize" if _vllm_counts(http, data[0]["id"]) else "estimated"
        return ServerInfo(base_url, "vllm", models, counting)
    return ServerInfo(base_url, "openai", models, "estimated")


#: the longest model name Iris takes from a server, in characters. Real ones are short:
#: OpenAI's "gpt-4o-mini", a hub's owner/name (at most 96 + 1 + 96), llama.cpp's and
#: vLLM's a file's path when no alias is given (some tens to a couple of hundred). The
#: name goes with every request and is stored with every turn: a 4 MiB one grew the
#: history by 16 MB a turn
MAX_MODEL_NAME = 1024


def _named(entries: object, address: str) -> list[dict]:
    """The entries of a ``/v1/models`` list that name a model: a non-empty string of at
    most :data:`MAX_MODEL_NAME` characters (longer ones are left out, said in the log).
    Raises ServerError when every name is too long: no model can be used."""
    named = [d for d in (entries if isinstance(entries, list) else [])
             if isinstance(d, dict) and isinstance(d.get("id"), str) and d["id"]]
    data = [d for d in named if len(d["id"]) <= MAX_MODEL_NAME]
    if len(data) < len(named):
        log.warning("%s lists %d models whose names are longer than %d characters; left out",
                    address, len(named) - len(data), MAX_MODEL_NAME)
    if named and not data:
        longest = max(len(d["id"]) for d in named)
        several = len(named) > 1
        raise ServerError(f"{address} names its model{'s' if several else ''} with "
                          f"{'up to ' if several else ''}{longest:,} characters, more than the "
                          f"{MAX_MODEL_NAME:,} Iris takes "
                          "(a name goes with every request and is kept with every turn), so "
                          "Iris did not connect; give the model a shorter name on the server "
                          "(llama-server --alias, vllm --served-model-name)")
    return data


def _llama_cpp_models(props: dict, data: list[dict]) -> tuple[ServerModel, ...]:
    """llama.cpp's one model: its window from ``/props`` (newer servers nest it in
    ``default_generation_settings``), its trained length from ``/v1/models`` meta."""
    settings = _obj(props.get("default_generation_settings"))
    window = _whole(settings.get("n_ctx")) or _whole(props.get("n_ctx"))
    meta = _obj(data[0].get("meta")) if data else {}
    alias = props.get("model_alias")
    alias = alias if isinstance(alias, str) and len(alias) <= MAX_MODEL_NAME else None
    name = (data[0]["id"] if data else None) or alias or "default"
    return (ServerModel(name, window, _whole(meta.get("n_ctx_train"))),)


def _llama_cpp_counting(http: _Http) -> str:
    """How this llama.cpp server counts a chat request, from the newest way it has."""
    probe = {"messages": [_PROBE_SYSTEM, _PROBE_USER]}
    if http.post("/v1/chat/completions/input_tokens", probe, missing_ok=True) is not None:
        return "input_tokens"
    if http.post("/apply-template", probe, missing_ok=True) is not None:
        return "apply-template"
    return "estimated"


def _vllm_counts(http: _Http, model: str) -> bool:
    probe = {"model": model, "messages": [_PROBE_SYSTEM, _PROBE_USER]}
    answer = http.post("/tokenize", probe, missing_ok=True)
    return isinstance(answer, dict) and "count" in answer


def _context_field(entry: dict) -> int | None:
    """The window a ``/v1/models`` entry states: vLLM's ``max_model_len``, llama.cpp's
    ``meta.n_ctx``, or the ``context_length`` / ``context_window`` other servers use."""
    meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
    for value in (entry.get("max_model_len"), meta.get("n_ctx"),
                  entry.get("context_length"), entry.get("context_window")):
        if _whole(value):
            return value
    return None


def _ollama_models(http: _Http, names: list[str]) -> tuple[ServerModel, ...]:
    """Ollama's window per model: ``num_ctx`` from the model's parameters, else what the
    loaded model runs with (``/api/ps``); the trained length is information only."""
    loaded = _obj(http.get("/api/ps", missing_ok=True)).get("models")
    running = {}
    for entry in loaded if isinstance(loaded, list) else []:
        entry = _obj(entry)
        key = entry.get("name") or entry.get("model")
        if isinstance(key, str):
            running[key] = _whole(entry.get("context_length"))
    models = []
    for name in names:
        shown = _obj(http.post("/api/show", {"model": name}, missing_ok=True))
        info = _obj(shown.get("model_info"))
        trained = _whole(info.get(f"{info.get('general.architecture')}.context_length"))
        parameters = shown.get("parameters")
        window = _num_ctx(parameters if isinstance(parameters, str) else "") or running.get(name)
        models.append(ServerModel(name, window, trained))
    return tuple(models)


def _num_ctx(parameters: str) -> int | None:
    """``num_ctx`` from Ollama's parameters text (one ``name value`` per line)."""
    for line in parameters.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "num_ctx" and parts[1].isdigit():
            return int(parts[1])
    return None

