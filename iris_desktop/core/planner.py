"""The request planner: the one place that decides what the model sees next.

A :class:`Planner` is an immutable snapshot of everything a request depends on — the
window, the token counter, the tool prompt, the context and compaction parameters — for
one settings version and one loaded runtime. It builds the typed
:class:`~iris_desktop.core.engine.ContextRequest` for a thread (and a draft), and it only
plans: the agent and the compactor are made by the host (``iris_desktop.host``) with a
planner, and build every request through it. The GUI's meter, inspector and message
states, the CLI's ``context`` and ``compact``, the agent and the compactor's checks
therefore all see the same request, and the request that is shown is the request that
is sent.

When settings or the model change, the owner makes a new Planner; nothing in one ever
changes. It may be shared between threads: each build uses the caller's own Store, and
the runtime's counting methods are safe from any thread (see ``runtime.model``).

Exact prompt size: when the runtime can count a whole rendered prompt (its chat template
is not a plain concatenation of messages, or it renders tool definitions itself), the
planner counts the request exactly as it will be sent and folds the difference from the
per-message counts into ``breakdown.system`` (``framing``), rebuilding once with that
much less history budget if the difference would overrun the budget.
"""

from __future__ import annotations

import datetime as dt
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from iris_desktop.core.config import AgentConfig, CompactionSettings, ContextParams, ToolsConfig
from iris_desktop.core.engine import ContextEngine, ContextRequest, ConversationTooLargeException
from iris_desktop.core.ports import ChatModel, Reranker
from iris_desktop.core.recall import RERANK_STOPPED, RankingCache, SemanticSearch, asks
from iris_desktop.core.records import names_relative_date
from iris_desktop.core.semantic import SemanticIndex, TextEmbedder
from iris_desktop.core.store import Store
from iris_desktop.core.toolcalls import tools_system_prompt
from iris_desktop.core.tools import Sandbox
from iris_desktop.settings import AUTO, Settings, SettingsError
from iris_desktop.tokens import (
    HeuristicCounter,
    Message,
    TokenCounter,
    as_prefix,
    continues_reply,
    shared_tiktoken,
)

#: the window when nothing says how large it is (no model loaded and model.n_ctx = 0)
FALLBACK_WINDOW = 8192
#: requests kept per planner; the GUI asks for a handful (meter, states, inspector, draft)
CACHE_SIZE = 32


@dataclass(frozen=True)
class ToolPrompt:
    """How the tools reach the model: described in the system prompt (``text``), or
    passed to a chat template that renders them itself (``native``)."""

    definitions: tuple[dict, ...] = ()
    text: str = ""
    native: bool = False
    native_tokens: int = 0

    @property
    def template_definitions(self) -> list[dict]:
        """What goes to the template's ``tools`` argument ([] unless native)."""
        return list(self.definitions) if self.native else []


#: semantic indexes per Store (weakly: a closed Store's index goes with it) and embedder
_indexes: weakref.WeakKeyDictionary[Store, dict[int, SemanticIndex]] = weakref.WeakKeyDictionary()
_indexes_lock = threading.Lock()


def window_for(settings: Any, n_ctx: int | None, source: str = "model") -> tuple[int, str]:
    """(window, source): ``context.window``, else the runtime's ``n_ctx`` (``source``:
    "model" for a local model, "server" or "config" for a server, as it was learned),
    else ``model.n_ctx`` ("config")."""
    configured = settings["context.window"]
    if configured != AUTO:
        return int(configured), "config"
    if n_ctx:
        return int(n_ctx), source
    return (settings["model.n_ctx"] or FALLBACK_WINDOW), "config"


def n_ctx_to_load(settings: Any, trained: int | None) -> int:
    """``model.n_ctx`` as a load of a model trained for ``trained`` tokens uses it: 0 is
    ``trained``, and so is the default when the model was trained for less (nobody chose
    8,192 for an older 4k model); a value the user set stays as set (``limit_problems``
    refuses one above ``trained``)."""
    n_ctx = settings["model.n_ctx"]
    default = getattr(settings, "source", lambda _key: "file")("model.n_ctx") == "default"
    if trained and (n_ctx == 0 or n_ctx > trained and default):
        return int(trained)
    return n_ctx


def limit_problems(settings: Any, n_ctx: int | None, trained: int | None) -> dict[str, str]:
    """Settings a model cannot honour, each named with both numbers: a window larger than
    the context llama.cpp allocated (``n_ctx``), or an ``n_ctx`` beyond what the model
    was trained for (one the user chose: the default loads at what the model was trained
    for). Such a request would otherwise fail inside llama.cpp mid-chat."""
    problems: dict[str, str] = {}
    window = settings["context.window"]
    if window != AUTO and n_ctx and int(window) > n_ctx:
        problems["context.window"] = (
            f"context.window: {int(window):,} tokens is more than the loaded model's n_ctx "
            f"of {n_ctx:,}; lower it, or raise model.n_ctx and reload the model")
    requested = n_ctx_to_load(settings, trained)
    if trained and requested > trained:
        problems["model.n_ctx"] = (
            f"model.n_ctx: {requested:,} tokens is more than the model was trained for "
            f"({trained:,}); use at most {trained:,}, or 0 for that maximum")
    return problems


def counter_for(settings: Any, runtime: ChatModel | None) -> TokenCounter:
    """The counter ``context.token_counter`` asks for. Never loads a model: before one
    is loaded, ``auto`` and ``model`` count with the heuristic."""
    kind = settings["context.token_counter"]
    if kind in (AUTO, "model") and runtime is not None:
        return runtime.counter()
    if kind == "tiktoken":
        return shared_tiktoken()
    return HeuristicCounter()


class Planner:
    """Builds the requests of one settings snapshot on one runtime (or none).

    ``builds`` counts the engine builds it ran (cache hits excluded), so tests can hold
    the GUI and the agent to a number of builds per sent message.
    """

    def __init__(
        self,
        params: ContextParams,
        counter: TokenCounter,
        *,
        runtime: ChatModel | None = None,
        compaction: CompactionSettings | None = None,
        agent: AgentConfig | None = None,
        tools: ToolsConfig | None = None,
        semantic: SemanticSearch | None = None,
        embedder: TextEmbedder | None = None,
        today: Callable[[], dt.date] = dt.date.today,
        reranker: Reranker | None = None,
        rerank: bool | None = None,
        previous_embedder: TextEmbedder | None = None,
    ):
        self.params = params
        #: the day a draft is asked on: what "yesterday" or "last week" in it means to recall
        self.today = today
        self.counter = counter
        self.runtime = runtime
        #: recall's ranking by meaning: a fixed search (benchmarks, tests), or one per Store
        #: over ``embedder``'s vectors (``core.semantic``), when an embedding model is loaded
        self.semantic = semantic
        self.embedder = embedder
        #: the model the stored vectors came from before ``embedder``, searched until they
        #: are re-embedded (``core.semantic``: a change of embedder)
        self.previous_embedder = previous_embedder if embedder is not None else None
        #: recall's cross-encoder, which reorders its first candidates (``context.recall_rerank``)
        self.reranker = reranker
        #: whether the settings ask for it (``context.recall_rerank``; default: a reranker was given)
        self.rerank = reranker is not None if rerank is None else rerank
        self.compaction = compaction or CompactionSettings()
        self.agent_config = agent or AgentConfig()
        self.tools = tools or ToolsConfig()
        #: set by the host when the settings' window did not fit the model and the
        #: model's n_ctx is used instead (a sentence for the status bar)
        self.warning: str | None = None
        self.builds = 0
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple, ContextRequest | ConversationTooLargeException] = (
            OrderedDict())
        self._tool_prompts: dict[bool, ToolPrompt] = {}
        self._rankings: dict[Path, RankingCache] = {}
        # the runtime can count a whole rendering, and this planner counts with its tokenizer
        self._counts_exactly = (runtime is not None and runtime.capabilities.exact_counts
                                and counter.name == runtime.counter().name)

    @property
    def counts_exactly(self) -> bool:
        """Whether its counts are the model's own, as the meter, the inspector and
        ``context``'s ``prompt_exact`` call them: an exact counter, or the runtime's own
        tokenizer, with which each request is counted whole (a template's framing goes to
        the system part, never into a message's count). False ("≈"): the heuristic,
        tiktoken, or a server's counts scaled from tiktoken."""
        return bool(getattr(self.counter, "exact", False)) or self._counts_exactly

    @classmethod
    def from_settings(cls, settings: Settings, runtime: ChatModel | None = None, *,
                      n_ctx: int | None = None, embedder: TextEmbedder | None = None,
                      reranker: Reranker | None = None,
                      previous_embedder: TextEmbedder | None = None) -> Planner:
        """The planner for ``settings`` on ``runtime``. ``n_ctx`` overrides the runtime's
        window (a candidate ``model.n_ctx`` that a reload would apply). Raises
        SettingsError when ``context.window`` exceeds the runtime's n_ctx."""
        source = "model"
        if not n_ctx and runtime is not None:
            n_ctx, source = runtime.n_ctx, runtime.window_source
        problem = limit_problems(settings, n_ctx, None).get("context.window")
        if problem:
            raise SettingsError(problem)
        window, source = window_for(settings, n_ctx, source)
        return cls(
            ContextParams.from_settings(settings, window, source),
            counter_for(settings, runtime),
            runtime=runtime,
            compaction=CompactionSettings.from_settings(settings),
            agent=AgentConfig.from_settings(settings),
            tools=ToolsConfig.from_settings(settings),
            embedder=embedder if settings["context.recall_semantic"] else None,
            reranker=reranker if settings["context.recall_rerank"] else None,
            rerank=bool(settings["context.recall_rerank"]),
            previous_embedder=previous_embedder,
        )

    @property
    def window(self) -> int:
        return self.params.window

    @property
    def window_source(self) -> str:
        return self.params.window_source

    # -- tools ----------------------------------------------------------------------------

    def tool_prompt(self, tools_allowed: bool = True) -> ToolPrompt:
        """The tools of a request; ``tools_allowed`` False once a turn used all its calls."""
        with self._lock:
            if tools_allowed in self._tool_prompts:
                return self._tool_prompts[tools_allowed]
        prompt = ToolPrompt()
        if tools_allowed and self.tools.max_calls_per_turn > 0:
            definitions = tuple(Sandbox.from_config(self.tools).definitions())
            native = (bool(definitions) and self.runtime is not None
                      and self.runtime.capabilities.native_tools)
            if native:
                tokens = self.runtime.tool_tokens(list(definitions))
                prompt = ToolPrompt(definitions, "", True, tokens)
            elif definitions:
                prompt = ToolPrompt(definitions, tools_system_prompt(list(definitions)))
        with self._lock:
            self._tool_prompts[tools_allowed] = prompt
        return prompt

    # -- requests -------------------------------------------------------------------------

    def engine(self, store: Store, *, recall: bool = True) -> ContextEngine:
        """An engine on ``store`` with this planner's counter and parameters; without
        recall for compaction's arithmetic (recall only fills what the tail leaves)."""
        params = self.params if recall else replace(self.params, recall_max_tokens=0)
        return ContextEngine(store, self.counter, params, self.semantic_for(store),
                             self.rankings_for(store), self.today, self.reranker)

    def rankings_for(self, store: Store) -> RankingCache:
        """Recall's recent searches on ``store``'s database file: the draft's prefill and
        the send of the same question get the same block (see :class:`RankingCache`). One
        cache per file, not per Store: the GUI's DB thread (the meter, the inspector) and
        its model thread (the prefill, the turn) each hold a Store of the same file, and a
        question ranked by one is not ranked again by the other."""
        with self._lock:
            cache = self._rankings.get(store.path)
            if cache is None:
                cache = self._rankings[store.path] = RankingCache()
            return cache

    def must_rank(self, store: Store, thread_id: int) -> bool:
        """Will the thread's next request wait for the cross-encoder? Its newest message is
        the user's, asks something, and no ranking of it over the latest summary's messages
        is kept (the draft's, ranked while it was typed, is): a question sent without a
        pause. What the send says in the status bar while it waits (``RecallSearch``)."""
        if self.reranker is None or self.params.recall_max_tokens <= 0:
            return False
        summary = store.latest_summary(thread_id)
        head = store.head(thread_id)
        if summary is None or head is None:
            return False
        row = store.messages_by_id([head]).get(head) or {}
        text = row.get("content")
        if row.get("role") != "user" or not isinstance(text, str) or not asks(text):
            return False
        return not self.rankings_for(store).holds(thread_id, summary.id, summary.covers_through_id, text)

    def semantic_for(self, store: Store) -> SemanticSearch | None:
        """Recall's search by meaning on ``store`` (one index per Store, so its vector
        cache lives as long as the Store's thread does), or None without an embedder."""
        if self.semantic is not None or self.embedder is None:
            return self.semantic
        return self.index(store).recall_search

    def index(self, store: Store) -> SemanticIndex:
        """The semantic index on ``store`` for this embedder (messages are embedded by
        ``index_pending``); shared by every planner, so a new planner keeps the cache."""
        with _indexes_lock:
            by_embedder = _indexes.setdefault(store, {})
            key = (id(self.embedder), id(self.previous_embedder))
            if key not in by_embedder:
                by_embedder[key] = SemanticIndex(store, self.embedder, previous=self.previous_embedder)
            return by_embedder[key]

    def plan(self, store: Store, thread_id: int, draft: str | None = None, *,
             tools_allowed: bool = True, recall: bool = True, cache: bool = True,
             continuing: bool = False) -> ContextRequest:
        """The request ``thread_id`` sends next (with ``draft`` as the newest message);
        ``continuing``: the request that goes on with the thread's last reply (it ends
        inside that reply, marked ``prefix``, and is counted so).

        Cached by the thread's state (newest message, summary and request), the draft and
        the options; ``cache=False`` for a database state that will be rolled back.
        Raises ConversationTooLargeException.
        """
        key = None
        if cache:
            key = (thread_id, store.thread_state(thread_id), draft, tools_allowed, recall,
                   continuing, self.today() if draft is not None and names_relative_date(draft) else None)
            with self._lock:
                hit = self._cache.get(key)
                if hit is not None:
                    self._cache.move_to_end(key)
            if isinstance(hit, ConversationTooLargeException):
                raise hit
            if hit is not None:
                return hit
        try:
            request = self._build(store, thread_id, draft, tools_allowed, recall, continuing)
        except ConversationTooLargeException as exc:
            self._remember(key, exc)
            raise
        if request.recall.rerank_reason != RERANK_STOPPED:  # asked again, it is reranked
            self._remember(key, request)
        return request

    def plan_or_error(self, store: Store, thread_id: int, draft: str | None = None
                      ) -> ContextRequest | ConversationTooLargeException:
        """:meth:`plan`, with a too-large conversation returned instead of raised."""
        try:
            return self.plan(store, thread_id, draft)
        except ConversationTooLargeException as exc:
            return exc

    def _remember(self, key: tuple | None, value: Any) -> None:
        if key is None:
            return
        with self._lock:
            self._cache[key] = value
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)

    def _build(self, store: Store, thread_id: int, draft: str | None, tools_allowed: bool,
               recall: bool, continuing: bool = False) -> ContextRequest:
        tools = self.tool_prompt(tools_allowed)
        engine = self.engine(store, recall=recall)
        request = self._engine_build(engine, thread_id, draft, tools, 0, continuing)
        exact = self._exact_size(request.messages, tools)
        if exact is None:
            return replace(request, tool_definitions=tools.template_definitions)
        framing = exact - request.predicted_prompt_tokens
        if framing > 0 and request.predicted_prompt_tokens + framing > request.breakdown.budget:
            # the template adds more than the per-message counts: make room and build again
            request = self._engine_build(engine, thread_id, draft, tools, framing, continuing)
            exact = self._exact_size(request.messages, tools)
            framing = exact - request.predicted_prompt_tokens
        breakdown = replace(request.breakdown, system=request.breakdown.system + framing)
        return replace(request, breakdown=breakdown, exact=True, framing=framing,
                       tool_definitions=tools.template_definitions)

    def _engine_build(self, engine: ContextEngine, thread_id: int, draft: str | None,
                      tools: ToolPrompt, reserve: int, continuing: bool = False) -> ContextRequest:
        with self._lock:
            self.builds += 1
        request = engine.build(thread_id, tools_text=tools.text, draft=draft,
                               native_tool_tokens=tools.native_tokens, reserve=reserve)
        last = request.messages[-1] if request.messages else None
        if continuing and draft is None and last is not None and last["role"] == "assistant":
            request = replace(request, messages=[*request.messages[:-1], as_prefix(last)])
        return request

    def _exact_size(self, messages: list[Message], tools: ToolPrompt) -> int | None:
        """The runtime's exact count of this rendering, when per-message counts are not
        already exact; None when the runtime cannot count (or counts another way)."""
        if not self._counts_exactly:
            return None
        if self.counter.exact and not tools.native and not continues_reply(messages):
            return None  # additive formats: the sum of the parts is the prompt, to the token
        return self.runtime.count_prompt(messages, tools.template_definitions or None)
