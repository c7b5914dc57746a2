"""The local model: loading, exact token counting, streaming generation.

One :class:`LocalModel` owns one ``llama_cpp.Llama`` (one context, one KV cache).
Every request goes through that instance, so consecutive requests whose prompts share
a prefix only evaluate the new suffix: llama-cpp-python's ``Llama.generate`` keeps the
longest common prefix of the tokens already in the context and removes the rest from
the KV cache. The chat formats (see :mod:`.chat_format`) make a conversation's prompt
grow by appending, so turn N+1 reuses all of turn N.

Prompts are built at token level: template text is tokenized with control tokens
recognized, message content as plain text (a user who types ``<end_of_turn>`` gets the
literal text, not a turn boundary). The token list llama.cpp evaluates is exactly
``prefix + message tokens... + generation prompt``, the same tokens the counter counts.

Generation drives ``Llama.generate`` directly rather than ``create_completion``: the
KV-prefix reuse is the same (it lives in ``generate``), and we get the token ids, so
completion-token counts are exact, control tokens like ``<start_of_turn>`` stop
generation, and ``cancel`` is checked between every two tokens.

Sliding-window attention (Gemma 2/3): by default llama.cpp keeps only the last
``n_swa + n_ubatch`` positions of the SWA layers. Removing the tail of the cache and
continuing from an earlier position then silently loses the window the SWA layers need
(llama-cpp-python does not check; llama-server does). ``load(swa_full=True)`` (the
default, and llama.cpp's own default for ``llama_context_default_params``) keeps a
full-size SWA cache, so any prefix can be reused. With ``swa_full=False`` we apply
llama-server's rule and fall back to a full re-evaluation when the cache no longer
holds the window the reused prefix needs.
"""


from __future__ import annotations

import codecs
import hashlib
import json
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iris_desktop.generation import GenerationRequest, GenerationStats
from iris_desktop.stop import Stop
from iris_desktop.tokens import Message, continues_reply

from .chat_format import ChatFormat, select_chat_format
from .control_text import control_spellings, template_tokens, text_parts
from .cpu import physical_cores
from .errors import ModelError, PromptTooLongError
from .first_use import checked_plan, gpu_failure, gpu_failures, gpu_worked
from .gguf import GGUFError, GGUFInfo, read_gguf_info
from .gpu import OFF, Device, GpuChecks, GpuPlan, cpu_plan, hold, let_go
from .kv_reuse import KVReuse, read_sequence, write_sequence
from .library import is_base_model, not_a_chat_model
from .llama_binding import EvalStopped, install_llama_logging, recent_llama_errors
from .loading import GpuRoom, load_weights, plan_device, q8_weights, remember_compute
from .protocol import (
    Capabilities,
    Generation,
    KVState,
    ModelFacts,
    Prefill,
    PrefillStats,
)
from .stops import StopMatcher, split_stops

log = logging.getLogger("iris.runtime")

__all__ = [
    "ModelError",
    "PromptTooLongError",
    "LocalModel",
    "ModelTokenCounter",
]


#: a prefill (work done while the user reads and types) evaluates this many tokens at a
#: time: a send or a new draft stops it part-way, and llama.cpp drops the whole batch it
#: was evaluating, so smaller pieces keep more of the work. Sends evaluate ``n_batch`` at
#: a time. bench/throughput.py measures what the smaller pieces cost.
PREFILL_CHUNK_TOKENS = 128


@dataclass
class _Run:
    """One generation's progress, shared by the steps of :meth:`LocalModel._stream`."""

    t0: float
    n_prompt: int = 0
    predicted_reuse: int = 0
    evaluated: int = 0
    completion: int = 0
    t_first: float | None = None
    t_last: float | None = None
    finish: str = "length"
    gen: Any = None


class LocalModel(KVReuse):
    """One loaded GGUF model (a :class:`~.protocol.Runtime`). Create with :meth:`load`;
    call :meth:`close` when done.

    Threads: generation is serialized by ``_lock`` (one KV cache), normally on the model
    thread. Tokenizing and counting are safe from any thread, also while a generation
    runs (llama.cpp's vocabulary is read-only after loading): they hold ``_life``, which
    :meth:`close` takes before it frees anything, so a model closed during a meter
    refresh raises a clean ``RuntimeError("... closed")`` instead of using freed memory.
    """

    #: the window is the context llama.cpp allocated for this model
    window_source = "model"
    where = "local"
    base_url: str | None = None
    is_loopback = True
    warning: str | None = None

    def __init__(
        self,
        llm: Any,
        info: GGUFInfo,
        chat_format: ChatFormat,
        *,
        identity: str,
        swa_full: bool,
        seed: int,
        kv_shift: bool = False,
    ) -> None:
        self._llm = llm
        self.info = info
        self.path = info.path
        self.chat_format = chat_format
        #: a base (pretrained-only) model: it continues text instead of following
        #: instructions, so the UI marks it and compaction skips the LLM summary
        self.base_model = is_base_model(info, info.path.name)
        self.identity = identity
        self.swa_full = swa_full
        self.seed = seed
        #: reuse a moved part of the cache (the verbatim tail after a compaction) by
        #: shifting its positions instead of evaluating it again (see _shift_reuse)
        self.kv_shift = kv_shift
        #: (at, was, run): a shift stopped part-way left ``run`` on the scratch sequence
        self._parked: tuple[int, int, list[int]] | None = None
        self.model_name = info.path.name
        self._lock = threading.Lock()
        self._life = threading.RLock()
        self._closing = threading.Event()
        self._closed = False
        self._grammars: dict[str, Any] = {}
        #: the control tokens' spellings (``_control_spellings``; False: not read yet)
        self._controls: re.Pattern | None | bool = False
        import llama_cpp

        self._n_ctx = int(llm.n_ctx())
        # llama.cpp asks this between graph nodes; a ctypes callback must stay referenced
        self._abort_callback = llama_cpp.ggml_abort_callback(
            lambda _data: llm._iris_stopping())
        llama_cpp.llama_set_abort_callback(llm.ctx, self._abort_callback, None)
        self._n_swa = int(llama_cpp.llama_model_n_swa(llm.model))
        # the model's own BOS rule (llama.cpp's add_bos_token) wins over the format's text
        bos = int(llm.token_bos())
        self._bos_id = bos if bos >= 0 and llm._model.add_bos_token() else None
        self._prefix_tokens = self._with_bos(self._parts_tokens([(chat_format.prefix(), True)]))
        self._generation_tokens = self._parts_tokens([(chat_format.generation_prompt(), True)])
        self._stop_ids, self._stop_strings = self._split_stops(chat_format.stop())
        # close the context before interpreter teardown even if close() is never called
        # (Llama.__del__ at exit raises a TypeError from half-destroyed modules)
        self._finalizer = weakref.finalize(self, llm.close)

    # -- loading -----------------------------------------------------------

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        n_ctx: int = 8192,
        n_threads: int | None = None,
        gpu: str | int = OFF,
        seed: int = 0,
        *,
        swa_full: bool = True,
        n_batch: int = 512,
        flash_attn: bool = True,
        kv_shift: bool = False,
        weights_dir: str | os.PathLike[str] | None = None,
        progress: Any = None,
        cancel: threading.Event | None = None,
        stage: Any = None,
        gpu_checks: str | os.PathLike[str] | None = None,
        devices: list[Device] | None = None,
        room: GpuRoom | None = None,
    ) -> LocalModel:
        """Validate the GGUF header, then load the model with llama.cpp.

        ``n_ctx=0`` uses the model's trained context length. ``n_threads`` is for
        generation and prompt evaluation alike; None: the physical cores this process may
        use (llama-cpp-python's own default is half the logical CPUs for generation, which
        leaves half of a machine without SMT idle). ``flash_attn``: llama.cpp's flash
        attention, which evaluates prompts faster on CPUs too (``bench/throughput.py``);
        a KV state saved without it is refused by a model with it, and the other way
        round (the V cache is laid out differently). ``weights_dir``: keep an exact Q8_0
        copy of the file's Q5_0 weights there and load that (:mod:`.weights`: the same
        values, prompts read ~25% faster on CPUs; written once, ~3 s for the bundled
        model); only for a model on the CPU; None loads the file as it is, as does a copy
        that cannot be made or loaded. ``progress(fraction)`` follows the copy and the
        weights' loading, and ``stage`` is told ``"copying"`` when a copy is being written
        (its time is left out of :attr:`load_time_s`), ``"checking"`` during a GPU's first-use
        check and ``"loading"`` after them; setting ``cancel`` stops it. Raises
        :class:`ModelError` for a missing, truncated or non-GGUF file, for a GGUF that is
        not a chat model (:func:`_chat_model_info`), for a cancel, and for anything
        llama.cpp refuses.

        ``gpu`` is ``model.gpu`` ("auto", "off" or a layer count): :func:`.gpu.plan_gpu`
        chooses the device and the layers from ``devices`` (default: what llama.cpp finds,
        :func:`.devices.list_devices`; none are looked for with "off"). ``gpu_checks``: the
        record of the first-use check (:class:`.gpu.GpuChecks`); a GPU not checked yet with
        its driver first runs a short greedy generation against the CPU's, and one that
        disagrees is left off (None: no check). The load's log must show the planned
        layers on the device; a load that fails is tried again with half the layers, then
        on the CPU. :attr:`gpu` holds the plan that loaded. ``room``: the GPU memory of the
        model this one replaces, counted as free (:class:`.loading.GpuRoom`).
        """
        p = Path(path)
        info = _chat_model_info(p)
        n_ctx = _context_length(p, info, n_ctx)
        chat_format = select_chat_format(info)

        install_llama_logging()
        recent_llama_errors()
        threads = n_threads or physical_cores()
        t0 = time.perf_counter()
        plan = plan_device(info, n_ctx, gpu, devices, gpu_checks, swa_full=swa_full, flash_attn=flash_attn,
                           room=room)
        if plan.on_gpu and gpu_checks is not None:
            plan = checked_plan(p, plan, GpuChecks(gpu_checks), threads, stage, cancel, flash_attn)
        load_path, weights, copy_s = p, "as published", 0.0  # the 8-bit copy: not the load's time
        if weights_dir is not None and not plan.on_gpu:
            copying = time.perf_counter()
            load_path, weights, progress = q8_weights(p, info, Path(weights_dir), progress, cancel, stage)
            copy_s = time.perf_counter() - copying
        scratch = kv_shift and not info.sliding_window
        params = dict(n_ctx=n_ctx, n_batch=n_batch, n_threads=threads, n_threads_batch=threads,
                      flash_attn=flash_attn, seed=seed, swa_full=swa_full)
        try:
            llm, plan, load_path, weights = load_weights(p, load_path, weights, weights_dir, plan,
                                                          scratch, progress, cancel, params)
        except Exception as exc:  # llama-cpp-python raises ValueError/RuntimeError
            if cancel is not None and cancel.is_set():
                raise ModelError(p, "loading was cancelled") from None
            why = "; ".join(recent_llama_errors()) or str(exc)
            raise ModelError(p, f"llama.cpp could not load the model ({why})") from None
        load_s = time.perf_counter() - t0 - copy_s
        remember_compute(plan, info, n_ctx, flash_attn, gpu_checks)
        # the copy's header names its tensor types: a KV state saved with the other
        # weights is read again rather than trusted
        identity = _header_identity(info if load_path == p else read_gguf_info(load_path))
        model = cls(llm, info, chat_format, identity=identity, swa_full=swa_full, seed=seed,
                    kv_shift=kv_shift)
        model.weights, model.gpu, model.gpu_checks, model.load_time_s = weights, plan, gpu_checks, load_s
        hold(model, plan)  # what it holds on a GPU is counted back where a load in its place is planned
        model._mapped = _file_state(load_path)
        log.info(
            "%s: loaded %s %s (%s, %.0f MB) in %.2f s; n_ctx %d, chat format %s, "
            "sliding window %d (swa_full=%s); %d threads, flash attention %s; weights %s; "
            "device %s (%s)%s",
            p, info.architecture, info.name or "", info.file_type or "?",
            info.size_bytes / 1e6, load_s, model.n_ctx, chat_format.name, model._n_swa, swa_full,
            threads, "on" if flash_attn else "off", weights, plan.describe(), plan.reason,
            f"; before it, the 8-bit copy (once) in {copy_s:.2f} s" if copy_s >= 0.01 else "",
        )
        return model

    load_time_s: float = 0.0
    #: the file llama.cpp maps its weights from, as it was at load: (path, size, mtime, inode)
    _mapped: tuple | None = None
    #: how the weights were loaded: "as published", or "Q5_0 read as Q8_0 (…)" (:mod:`.weights`)
    weights: str = "as published"
    #: where it runs: the device and layers llama.cpp loaded it with, and why (:mod:`.gpu`)
    gpu: GpuPlan = cpu_plan(0, "loaded without a plan")
    #: the first-use checks' record, where a GPU that fails (a reply, a warm-up) is recorded off;
    #: and then the sentence that said so (:func:`.first_use.gpu_failure`; None: it did not)
    gpu_checks: str | os.PathLike[str] | None = None
    gpu_failed: str | None = None

    # -- basics ------------------------------------------------------------

    @property
    def llm(self) -> Any:
        """The underlying ``llama_cpp.Llama`` (for diagnostics; do not generate with it
        directly while a :meth:`stream` is running)."""
        self._check_open()
        return self._llm

    @property
    def n_ctx(self) -> int:
        """The context size llama.cpp allocated (fixed at load; readable after close)."""
        return self._n_ctx

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.path}: the model is closed")

    def _check_file(self) -> None:
        """ModelError when the file the weights are mapped from changed on disk since the
        load (truncated in place by a download or a sync tool, rewritten, replaced):
        reading a mapped page past a truncation kills the process (SIGBUS, no word said).
        One stat per request."""
        if self._mapped is not None and _file_state(self._mapped[0]) != self._mapped:
            raise ModelError(self._mapped[0], "the model file changed on disk since it was "
                                              "loaded; load it again (Model ▸ Reload)")

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        """Tokens of ``text``, without BOS. ``special``: recognize control-token text
        such as ``<start_of_turn>`` (template text) or not (user content)."""
        if not text:
            return []
        with self._life:
            self._check_open()
            return self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)

    def detokenize(self, tokens: list[int]) -> str:
        with self._life:
            self._check_open()
            return self._llm.detokenize(list(tokens)).decode("utf-8", errors="replace")

    def _parts_tokens(self, parts: list[tuple[str, bool]]) -> list[int]:
        out: list[int] = []
        for text, template in parts:
            out.extend(self.tokenize(text, special=template))
        return out

    def _with_bos(self, tokens: list[int]) -> list[int]:
        if self._bos_id is not None and (not tokens or tokens[0] != self._bos_id):
            return [self._bos_id, *tokens]
        return tokens

    def message_tokens(self, message: Message, index: int = 1) -> list[int]:
        """The exact tokens ``message`` contributes to a prompt (for a template that is
        not additive, its estimate); its text is read as text (:meth:`_template_tokens`)."""
        parts = self.chat_format.message_parts(message, index)
        return self._parts_tokens(text_parts(parts, message.get("content"), self._control_spellings()))

    @property
    def native_tools(self) -> bool:
        """The chat template renders tool definitions itself."""
        return bool(getattr(self.chat_format, "supports_tools", False))

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(exact_counts=True, native_tools=self.native_tools, prefill=True,
                            kv_state=True)

    def tool_tokens(self, tools: list[dict]) -> int:
        """What passing ``tools`` to the template adds to a prompt (0 without native tools)."""
        if not tools or not self.native_tools:
            return 0
        # Iris always sends a system message first; templates fold the tools into it
        probe = [{"role": "system", "content": "."}, {"role": "user", "content": "."}]
        return len(self.prompt_tokens(probe, tools)) - len(self.prompt_tokens(probe))

    def prompt_tokens(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        """The exact token list :meth:`stream` evaluates for ``messages``. A trailing
        assistant message marked ``"prefix": True`` is continued, not closed: the prompt
        ends inside it (a stopped reply goes on from there)."""
        if continues_reply(messages):
            return self._continuation_tokens(list(messages), tools)
        if tools and self.native_tools:
            return self._template_tokens(
                lambda ms: self.chat_format.render_prompt(ms, tools=tools), list(messages))
        if self.chat_format.additive:
            tokens = list(self._prefix_tokens)
            for i, m in enumerate(messages):
                tokens.extend(self.message_tokens(m, i))
            tokens.extend(self._generation_tokens)
            return tokens
        return self._template_tokens(self.chat_format.render_prompt, list(messages))

    def _continuation_tokens(self, messages: list[Message], tools: list[dict] | None) -> list[int]:
        """The prompt that ends inside the trailing assistant message: its closing
        template text and the generation prompt left out."""
        if (tools and self.native_tools) or not self.chat_format.additive:
            native = tools if self.native_tools else None
            return self._template_tokens(
                lambda ms: self.chat_format.render_continuation(ms, tools=native), messages)
        tokens = list(self._prefix_tokens)
        for i, m in enumerate(messages[:-1]):
            tokens.extend(self.message_tokens(m, i))
        parts = self.chat_format.message_parts(messages[-1], len(messages) - 1)
        while parts and parts[-1][1]:  # the template's closing text after the content
            parts.pop()
        tokens.extend(self._parts_tokens(parts))
        return tokens

    def _template_tokens(self, render: Callable[[list[Message]], str],
                         messages: list[Message]) -> list[int]:
        """The tokens of a template's rendering of ``messages``: the template's own text
        read with its control tokens, each message's text as text (:mod:`.control_text`)."""
        return self._with_bos(template_tokens(render, messages, lambda text, special: self.tokenize(
            text, special=special), self._control_spellings()))

    def _control_spellings(self) -> re.Pattern | None:
        """The model's control tokens' spellings (:func:`.control_text.control_spellings`),
        read once."""
        if self._controls is False:
            with self._life:
                self._check_open()
                self._controls = control_spellings(self._llm)
        return self._controls

    def count_prompt(self, messages: list[Message], tools: list[dict] | None = None) -> int:
        """The exact number of prompt tokens :meth:`stream` evaluates for ``messages``."""
        return len(self.prompt_tokens(messages, tools))

    def render_prompt(self, messages: list[Message]) -> str:
        """The prompt as text (for display and debugging; generation uses
        :meth:`prompt_tokens`, which tokenizes message content as plain text)."""
        return self.chat_format.render_prompt(list(messages))

    def describe(self) -> ModelFacts:
        info = self.info
        return ModelFacts(
            name=display_name(self.path.name) or info.name or self.path.stem,
            file=self.path.name, path=str(self.path),
            n_ctx=self.n_ctx, context_length=info.context_length, base_model=self.base_model,
            architecture=info.architecture or "", file_type=info.file_type or "",
            size_bytes=info.size_bytes or 0, chat_format=self.chat_format.name,
            load_time_s=self.load_time_s, license=_license(self.path, info.metadata or {}),
            device=self.gpu.describe(), device_reason=self.gpu.reason,
            device_notice=self.gpu.reason if self.gpu.notice else "")

    def counter(self) -> ModelTokenCounter:
        return ModelTokenCounter(self)

    def _split_stops(self, stops: list[str]) -> tuple[set[int], list[str]]:
        """:func:`.stops.split_stops` with this model's tokenizer and vocabulary."""
        return split_stops(stops, lambda s: self.tokenize(s, special=True), self._llm._model.vocab)
    # -- generation --------------------------------------------------------

    def _grammar(self, json_schema: dict | None, response_format: dict | None,
                 grammar: Any) -> Any:
        from llama_cpp import LlamaGrammar

        if grammar is not None:
            if isinstance(grammar, str):
                key = "gbnf:" + grammar
                if key not in self._grammars:
                    self._grammars[key] = LlamaGrammar.from_string(grammar, verbose=False)
                return self._grammars[key]
            return grammar
        schema = json_schema
        if schema is None and response_format:
            kind = response_format.get("type")
            if kind == "json_schema":
                spec = response_format.get("json_schema") or {}
                schema = spec.get("schema", spec)
            elif kind == "json_object":
                schema = response_format.get("schema") or {"type": "object"}
        if schema is None:
            return None
        # not sort_keys: the grammar keeps the schema's property order (the order the
        # model writes the fields in), so differently ordered schemas are different keys
        key = json.dumps(schema)
        if key not in self._grammars:
            self._grammars[key] = LlamaGrammar.from_json_schema(key, verbose=False)
        return self._grammars[key]

    def stream(self, request: GenerationRequest, grammar: Any = None) -> Generation:
        """Generate the reply ``request`` asks for, yielding text pieces as they come.

        Its ``tools`` (OpenAI definitions) are passed to a chat template that renders
        tools itself (:attr:`native_tools`); other formats get them in the system prompt
        from the caller, and ignore them.

        Its ``cancel`` is checked between tokens and between chunks of the prompt's
        evaluation; when set, or once ``time.monotonic()`` passes its ``deadline``,
        generation stops with ``finish_reason == "cancelled"`` (closing the iterator
        early counts as a cancel too). Its ``json_schema`` (or ``response_format``, or a
        GBNF ``grammar``, this runtime's own) constrains the output. ``temperature=0`` is
        greedy. Once the :class:`~.protocol.Generation` ends, its ``stats`` hold the
        :class:`~iris_desktop.generation.GenerationStats`.

        Raises :class:`PromptTooLongError` (at the first ``next``) when the prompt
        leaves no room in the context window, and ModelError when the model's file changed
        on disk since it was loaded (:meth:`_check_file`).
        """
        self._check_open()
        self._check_file()
        r = request
        options = dict(
            max_tokens=r.max_tokens, temperature=r.temperature, cancel=r.cancel,
            grammar=self._grammar(r.json_schema, r.response_format, grammar),
            sampling=dict(top_k=r.top_k, top_p=r.top_p, min_p=r.min_p,
                          repeat_penalty=r.repeat_penalty, dry_multiplier=r.dry_multiplier),
            seed=self.seed if r.seed is None else r.seed, extra_stop=r.stop or [],
            tools=r.tools if self.native_tools else None, deadline=r.deadline,
            progress=r.progress,
        )
        return Generation(lambda result: self._stream(result, list(r.messages), **options))

    def _stream(self, result: Generation, messages: list[Message], *, max_tokens: int,
                temperature: float,
                cancel: threading.Event | None, grammar: Any, sampling: dict,
                seed: int, extra_stop: list[str], tools: list[dict] | None = None,
                deadline: float | None = None, progress: Any = None) -> Iterator[str]:
        with self._lock:
            self._check_open()
            llm = self._llm
            run = _Run(t0=time.perf_counter())
            tokens = self.prompt_tokens(messages, tools)
            run.n_prompt = len(tokens)
            n_ctx = int(llm.n_ctx())
            if run.n_prompt >= n_ctx:
                raise PromptTooLongError(run.n_prompt, n_ctx)
            max_tokens = min(max_tokens, n_ctx - run.n_prompt)

            def should_stop() -> bool:
                return (self._closing.is_set() or (cancel is not None and cancel.is_set())
                        or (deadline is not None and time.monotonic() > deadline))

            try:
                if cancel is not None and cancel.is_set():
                    run.finish = "cancelled"
                    return
                run.gen = self._start_generation(run, tokens, should_stop, seed, progress,
                                                 dict(temp=temperature, grammar=grammar, **sampling))
                if run.gen is not None:
                    yield from self._generate(run, should_stop, extra_stop, max_tokens)
                    gpu_worked(self, run.finish)  # its GPU's count of failing runs starts again
            except GeneratorExit:
                run.finish = "cancelled"
                raise
            except BaseException as exc:
                run.finish = "error"
                if (failed := gpu_failure(self, exc)) is not None:  # llama.cpp failed on the GPU
                    raise failed from exc
                raise
            finally:
                llm.iris_should_stop = llm.iris_progress = None
                if run.gen is not None:
                    run.gen.close()
                result.stats = self._generation_stats(run)
                log.debug("generation: %s", result.stats)

    def _start_generation(self, run: _Run, tokens: list[int], should_stop: Any, seed: int,
                          progress: Any, sampling: dict) -> Any:
        """Prompt setup: reuse (and shift) what the cache holds, then start
        ``Llama.generate``; None when a part-way shift was stopped (``run`` says so)."""
        llm = self._llm
        llm.iris_evaluated = 0
        llm.iris_should_stop = should_stop
        shifted, stopped = self._shift_reuse(tokens)
        if stopped:
            run.evaluated = int(llm.iris_evaluated)
            run.finish = "cancelled"
            return None
        run.predicted_reuse = predicted = self._plan_reuse(tokens) - shifted
        n_prompt = run.n_prompt
        llm.set_seed(seed)
        sampling = dict(sampling)
        llm.iris_dry = sampling.pop("dry_multiplier", 0.0)  # read as generate builds its chain
        if progress is not None:  # what is cached already, then batch by batch
            progress(predicted, n_prompt)
            llm.iris_progress = lambda done, _todo: progress(predicted + done, n_prompt)
        return llm.generate(tokens, **sampling)

    def _generate(self, run: _Run, should_stop: Any, extra_stop: list[str],
                  max_tokens: int) -> Iterator[str]:
        """The token loop: yield the text of each token until a stop, the length, a
        cancel or the end; ``run`` records what happened."""
        import llama_cpp

        llm, gen = self._llm, run.gen
        stop_ids = set(self._stop_ids)
        stop_strings = list(self._stop_strings)
        if extra_stop:
            more_ids, more_strings = self._split_stops(extra_stop)
            stop_ids |= more_ids
            stop_strings += more_strings
        matcher = StopMatcher(stop_strings)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        vocab = llm._model.vocab
        while True:
            if should_stop():
                run.finish = "cancelled"
                break
            try:
                token = next(gen)
            except StopIteration:
                run.finish = "stop"
                break
            except EvalStopped as stopped:
                run.evaluated = int(llm.iris_evaluated)
                log.info("prompt evaluation %s", stopped)
                run.finish = "cancelled"
                break
            now = time.perf_counter()
            if run.t_first is None:
                run.t_first = now
                # only the prompt has been evaluated so far
                run.evaluated = int(llm.iris_evaluated)
                llm.iris_progress = None  # what follows is one token at a time
            if token in stop_ids or llama_cpp.llama_vocab_is_eog(vocab, token):
                run.finish = "stop"
                break
            run.completion += 1
            run.t_last = now
            out, hit = matcher.feed(decoder.decode(llm.detokenize([token])))
            if out:
                yield out
            if hit:
                run.finish = "stop"
                break
            if run.completion >= max_tokens:
                run.finish = "length"
                break
        rest, hit = matcher.feed(decoder.decode(b"", final=True))
        tail = rest + ("" if hit else matcher.flush())
        if tail:
            yield tail

    def _generation_stats(self, run: _Run) -> GenerationStats:
        """What a generation did, as llama.cpp counted it."""
        t_end = time.perf_counter()
        t_first, t_last, completion, evaluated = run.t_first, run.t_last, run.completion, run.evaluated
        if t_first is None:
            reused = 0 if run.gen is None else run.predicted_reuse
            # stopped during the prompt: what llama.cpp really evaluated
            # (before generate: what a part-way shift evaluated, or nothing)
            evaluated = evaluated if run.gen is None else int(self._llm.iris_evaluated)
        else:
            reused = run.n_prompt - evaluated
            if reused != run.predicted_reuse:
                log.debug("KV reuse: predicted %d, llama.cpp evaluated %d of %d",
                          run.predicted_reuse, evaluated, run.n_prompt)
        rate = 0.0
        if completion > 1 and t_first is not None and t_last is not None and t_last > t_first:
            rate = (completion - 1) / (t_last - t_first)
        return GenerationStats(
            prompt_tokens=run.n_prompt,
            reused_tokens=reused,
            evaluated_tokens=evaluated,
            completion_tokens=completion,
            time_to_first_token_s=(t_first - run.t0) if t_first is not None else 0.0,
            tokens_per_s=rate,
            duration_s=t_end - run.t0,
            finish_reason=run.finish,
        )

    def prefill(self, messages: list[Message], tools: list[dict] | None = None, *,
                cancel: Stop | None = None) -> Prefill:
        """Evaluate the prompt of ``messages`` into the KV cache without generating, so
        that a request for them (or for them and more) starts at once. Only what differs
        from the cache is evaluated, ``PREFILL_CHUNK_TOKENS`` at a time; the
        :class:`~.protocol.Prefill` yields ``(evaluated, total)`` after each. ``cancel``
        (anything with ``is_set()``) stops it between two graph nodes (a send preempts a
        warm-up this way), and so does closing the Prefill; what was evaluated stays
        cached. Raises PromptTooLongError (at the first ``next``), ModelError for a file
        changed since it was loaded, and GpuFailed (its GPU recorded off) as a reply does."""
        self._check_open()
        self._check_file()
        return Prefill(lambda result: gpu_failures(self, self._prefill(result, list(messages), tools, cancel)))

    def _prefill(self, result: Prefill, messages: list[Message], tools: list[dict] | None,
                 cancel: Stop | None) -> Iterator[tuple[int, int]]:
        with self._lock:
            self._check_open()
            llm = self._llm
            tokens = self.prompt_tokens(messages, tools)
            if len(tokens) >= self.n_ctx:
                raise PromptTooLongError(len(tokens), self.n_ctx)
            llm.iris_evaluated = 0

            def stopping() -> bool:
                return self._closing.is_set() or bool(cancel is not None and cancel.is_set())

            llm.iris_should_stop = stopping
            shifted, stopped = self._shift_reuse(tokens, PREFILL_CHUNK_TOKENS)
            if stopped:
                llm.iris_should_stop = None
                result.stats = PrefillStats(len(tokens), 0, shifted, True)
                return
            reuse = self._plan_reuse(tokens)
            todo = tokens[reuse:]
            llm.n_tokens = reuse
            reuse -= shifted  # evaluated just now, not reused
            step = max(1, min(llm.n_batch, PREFILL_CHUNK_TOKENS))
            try:
                for start in range(0, len(todo), step):
                    if start and stopping():
                        stopped = True
                        break
                    part = todo[start:start + step]
                    try:
                        llm.eval(part)
                    except EvalStopped:
                        stopped = True
                        break
                    yield reuse + shifted + start + len(part), len(tokens)
            except GeneratorExit:
                stopped = True
                raise
            finally:
                llm.iris_should_stop = None
                result.stats = PrefillStats(len(tokens), reuse, int(llm.iris_evaluated), stopped)

    def kv_tokens(self) -> list[int]:
        """The tokens whose keys and values are in the KV cache, in order."""
        with self._life:
            self._check_open()
            return [int(t) for t in self._llm.input_ids[: self._llm.n_tokens]]

    def kv_state(self) -> KVState | None:
        """A copy of the KV cache: its tokens and llama.cpp's per-sequence copy of their
        keys and values (``llama_state_seq_get_data``: no logits). None when empty."""
        with self._lock:
            self._check_open()
            tokens = self.kv_tokens()
            if not tokens:
                return None
            return KVState(tokens, read_sequence(self._llm.ctx))

    @property
    def weights_stamp(self) -> str:
        """The file the weights were mapped from, as it was at load (size, modification
        time, inode), hashed: a saved KV state is only for these weights
        (``kv_store.model_key``). A file replaced by other weights with the same GGUF header
        and size gets another; an unchanged file (the bundled model, its 8-bit copy) keeps
        its own across restarts."""
        if self._mapped is None:
            return ""
        return hashlib.sha256(repr(self._mapped[1:]).encode()).hexdigest()[:12]

    def restore_kv_state(self, state: KVState) -> bool:
        """Put a checked state into the (cleared) cache; False if llama.cpp refuses it (the
        cache is then empty). The next request computes the logits it did not save."""
        tokens = list(state.tokens)
        if len(tokens) >= self.n_ctx:
            return False
        with self._lock:
            self._check_open()
            return write_sequence(self._llm, tokens, state.data)

    def close(self) -> None:
        """Free the model and its context. Idempotent. A generation running in another
        thread is stopped at its next token first."""
        self._closing.set()
        with self._lock, self._life:  # no generation, no tokenizing while it is freed
            if self._closed:
                return
            self._closed = True
            self._finalizer()  # runs llm.close() once
            let_go(self)

    def __enter__(self) -> LocalModel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"n_ctx={self._llm.n_ctx()}"
        return f"<LocalModel {self.path.name} {self.chat_format.name} {state}>"


#: a quantization (Q4_K_M, IQ4_XS, Q8_0, F16, BF16) or a split part (-00001-of-00003)
#: at the end of a GGUF file's name
_NAME_TAIL = re.compile(r"[-_.](?:i?q\d+(?:_[a-z0-9]+)*|f16|f32|bf16|fp16|\d{5}-of-\d{5})$", re.I)
#: a parameter count ("0.5b", "270m", "8x7b"), its unit written in capitals
_PARAMETERS = re.compile(r"(?:\d+x)?\d+(?:\.\d+)?[bmk]", re.I)


def display_name(file_name: str) -> str:
    """A model's name from its file name, as model names are written: the quantization
    dropped (the file type says it), each part capitalized, a size in capitals
    ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" → "Qwen2.5-Coder-0.5B-Instruct"). The
    GGUF header's ``general.name`` is often a converter's leftover (the bundled Q4_K_M
    file says "… Instruct AWQ"). Empty when the name has nothing left."""
    stem = file_name[:-5] if file_name.lower().endswith(".gguf") else file_name
    while (shorter := _NAME_TAIL.sub("", stem)) != stem:
        stem = shorter
    parts = []
    for part in stem.split("-"):
        if part.lower() != part or re.fullmatch(r"v\d.*|it", part):
            parts.append(part)  # already written as its authors write it
        elif _PARAMETERS.fullmatch(part):
            parts.append(part[:-1] + part[-1].upper())
        else:
            parts.append(part[:1].upper() + part[1:])
    return "-".join(p for p in parts if p)


def _license(path: Path, metadata: dict[str, Any]) -> str:
    """The model's license: the bundled model's is known; another file's is what its
    GGUF header says (``general.license``), if anything."""
    from .bundled import BUNDLED_MODEL

    if path.name == BUNDLED_MODEL.file_name:
        return f"{BUNDLED_MODEL.license} ({BUNDLED_MODEL.license_url})"
    named = metadata.get("general.license")
    return str(named) if named else "not stated in the file; see where it came from"


def _chat_model_info(p: Path) -> GGUFInfo:
    """The header of the chat model ``p``; ModelError for a file that is no GGUF or no
    chat model ("not a chat model: an embedding model; …", the library's rule,
    ``library.not_a_chat_model``: an embedding model loaded, was saved as the chat
    model, then failed every send with llama.cpp's "Memory is not initialized")."""
    try:
        info = read_gguf_info(p)
    except GGUFError as exc:
        raise ModelError(p, exc.reason) from None
    not_chat = not_a_chat_model(info)
    if not_chat:
        raise ModelError(p, f"not a chat model: {not_chat}; it cannot write replies")
    return info


def _context_length(path: Path, info: GGUFInfo, n_ctx: int) -> int:
    """``n_ctx`` as a load uses it: 0 is the model's trained context length (else 4,096);
    one past the trained length is allowed, with a warning."""
    if n_ctx < 0:
        raise ValueError(f"n_ctx must be >= 0, not {n_ctx}")
    if n_ctx == 0:
        return info.context_length or 4096
    if info.context_length and n_ctx > info.context_length:
        log.warning("%s: n_ctx %d is larger than the trained context length %d", path, n_ctx, info.context_length)
    return n_ctx


def _header_identity(info: GGUFInfo) -> str:
    """sha256 of the GGUF header (metadata + tensor infos): it contains the whole
    tokenizer and chat template, so it changes whenever tokenization could, and costs
    milliseconds instead of hashing the whole file."""
    digest = hashlib.sha256()
    with open(info.path, "rb") as fh:
        remaining = info.header_size or info.size_bytes
        while remaining > 0:
            block = fh.read(min(remaining, 4 * 1024 * 1024))
            if not block:
                break
            digest.update(block)
            remaining -= len(block)
    return digest.hexdigest()


#: how messages are rendered for counting; 2: Jinja messages measured after a system
#: message, so a template's default system prompt is not counted with every message
COUNT_SCHEME = 2


def _file_state(path: Path) -> tuple:
    """(path, size, modification time, inode) of ``path``; ``None``s when it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return (path, None, None, None)
    return (path, st.st_size, st.st_mtime_ns, st.st_ino)


class ModelTokenCounter:
    """Exact token counts for one model and chat format (``iris_desktop.tokens.TokenCounter``).

    ``count_message(m)`` is the number of tokens ``m`` adds to a prompt;
    ``prompt_overhead()`` the BOS/prefix plus the generation prompt. For the additive
    formats (gemma, chatml) ``prompt_overhead() + sum(count_message(m))`` is exactly the
    number of tokens llama.cpp evaluates; for an embedded Jinja template it is an
    estimate from rendering each message alone (``exact`` is then False).
    Nothing is cached here (the store caches per message and counter name).
    """

    def __init__(self, model: LocalModel) -> None:
        self._model = model
        # the scheme number changes whenever the way messages are counted changes, so the
        # store's cached counts from an older scheme are never mixed in
        self.name = f"model:{model.identity[:12]}:{COUNT_SCHEME}:{model.chat_format.name}"
        self.exact = bool(model.chat_format.additive)

    def count_text(self, text: str) -> int:
        return len(self._model.tokenize(text, special=False))

    def count_message(self, message: Message) -> int:
        return len(self._model.message_tokens(message))

    def prompt_overhead(self) -> int:
        return len(self._model._prefix_tokens) + len(self._model._generation_tokens)

    def __repr__(self) -> str:
        return f"<ModelTokenCounter {self.name}>"
