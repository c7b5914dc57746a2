"""``context``: what the next request holds, from the host's planner."""

from __future__ import annotations

import sys
from typing import Any

from iris_desktop.commands.common import (
    EXIT_OK,
    EXIT_TOO_LARGE,
    CliError,
    _index_for_recall,
    _maybe_load_model,
    _thread,
    dump_json,
    open_host,
    say,
    say_where,
    text_argument,
)
from iris_desktop.untrusted import show_untrusted

# -- the context ---------------------------------------------------------------------------


def context_report(host, thread_id: int, draft: str | None = None,
                   show_request: bool = False) -> dict[str, Any]:
    """What ``context --json`` prints; raises ConversationTooLargeException."""
    from iris_desktop.core.views import dropped_report, rerank_fact

    planner = host.planner()
    runtime = host.runtime
    request = planner.plan(host.store, thread_id, draft)
    b = request.breakdown
    summary = request.summary
    report: dict[str, Any] = {
        "thread_id": thread_id,
        "window": b.window,
        "window_source": request.window_source,
        "token_budget_ratio": b.ratio,
        "compaction_threshold": planner.params.compaction_threshold,
        "counter": request.counter,
        "counter_exact": planner.counter.exact,
        "prompt_exact": request.exact or planner.counter.exact,
        "chat_format": runtime.chat_format.name if runtime is not None else None,
        "where": runtime.where if runtime is not None else None,
        "budget": b.budget,
        "system_tokens": b.system,
        "tool_tokens": b.tools,
        "summary_tokens": b.summary,
        "recall_tokens": b.recall,
        "history_tokens": b.history,
        "draft_tokens": b.draft,
        "template_framing_tokens": request.framing,
        "available": b.available,
        "free": b.free,
        "threshold_tokens": b.threshold,
        "predicted_prompt_tokens": request.predicted_prompt_tokens,
        "last_prompt_tokens": request.last_prompt_tokens,
        "protect_turns": request.protect_turns,
        "configured_protect_turns": request.configured_protect_turns,
        "fallback": request.fallback,
        "compaction_due": request.compaction_due,
        "trigger": request.trigger,
        "triggers": request.triggers,
        "unsummarized_turns": request.unsummarized_turns,
        "dropped_turns": request.dropped_turns,
        "tools": [d["function"]["name"] for d in planner.tool_prompt().definitions],
        "tools_native": planner.tool_prompt().native,
        "summary_id": summary.id if summary else None,
        "summary_fields": summary.fields if summary else None,
        "recall": {"ids": request.recall.ids, "text": request.recall.text, "terms": request.recall.terms,
                   "reason": request.recall.reason,
                   "semantic": request.recall.semantic,
                   # the embedding model of recall by meaning, and the one before it while
                   # the history is re-embedded (its vectors are searched meanwhile)
                   "embedder": planner.embedder.identity if planner.embedder else None,
                   "embedder_previous": planner.previous_embedder.identity if planner.previous_embedder else None,
                   # why it is not the one context.recall_embedder names (files damaged)
                   "embedder_problem": host.embedder_problem,
                   # whether the cross-encoder reordered its candidates, and why not
                   **rerank_fact(request.recall, planner, host.reranker_problem),
                   "max_tokens": planner.params.recall_max_tokens},
        "compactions": host.store.compaction_events(thread_id, branch=True),
        "messages": planner.engine(host.store).describe(request),
    }
    # what the request leaves out and why, in whole sentences (never shortened)
    report["dropped"] = dropped_report(request, report["messages"], report["compactions"])
    if host.model_error:
        report["model_error"] = host.model_error
    if show_request:
        report["request"] = request.messages
    return report


#: a chat with at least this many messages never counted says so before ``context``
#: counts them for its list (100,000 messages: two silent minutes on two cores)
SAY_COUNTING = 2_000


def _say_counting(host, thread_id: int) -> None:
    _, uncounted = host.store.thread_token_total(thread_id, host.planner().counter.name)
    if uncounted >= SAY_COUNTING:
        say(f"iris-desktop: counting the tokens of thread {thread_id}'s {uncounted:,} messages "
            "(once: the counts are kept)…", file=sys.stderr)


def context(args, overrides) -> int:
    from iris_desktop.core.engine import ConversationTooLargeException

    draft = text_argument(args.draft, "--draft") if args.draft is not None else None
    with open_host(args, overrides) as host:
        if args.thread is None:  # the chat written to last, named (a newcomer's first try)
            args.thread = host.store.newest_thread_id()
            if args.thread is None:
                raise CliError("there are no chats yet: start one with 'iris-desktop chat "
                               "\"Hello\"' (or import one), then 'iris-desktop context'")
            say(f"iris-desktop: thread {args.thread} (the chat written to last)", file=sys.stderr)
        _thread(host, args.thread)
        _maybe_load_model(host, args)
        runtime = host.runtime
        if runtime is not None and runtime.capabilities.exact_counts:  # a server counting
            say_where(runtime, "to be counted")  # with its own tokenizer reads the chat
        if host.runtime is not None:
            _index_for_recall(host, args.thread)
        _say_counting(host, args.thread)
        try:  # a huge newest turn is refused from its size, before it is counted
            report = context_report(host, args.thread, draft, args.show_request)
        except ConversationTooLargeException as exc:
            say(f"iris-desktop: conversation too large: {exc}", file=sys.stderr)
            if args.json:  # a script reading stdout gets the refusal too (it got nothing)
                print(dump_json({"error": "too_large", "message": str(exc),
                                 "needed": exc.needed, "allowed": exc.allowed}, indent=2))
            return EXIT_TOO_LARGE
    if args.json:
        print(dump_json(report, indent=2))
        return EXIT_OK
    _print_context(report)
    return EXIT_OK


def refuse_if_certainly_too_large(host, n_bytes: int, outcome: str,
                                  thread_id: int | None = None) -> None:
    """Exit 3 before anything is tokenized when ``n_bytes`` of text in the newest turn
    are certainly more than any history budget of this window: they need at least
    store.min_tokens(n_bytes) tokens. Tokenizing 10 MiB takes tens of seconds and over
    a gigabyte, only to reach the same answer."""
    from iris_desktop.core.agent import TOO_LARGE_REMEDY
    from iris_desktop.core.engine import certainly_too_large

    planner = host.planner()
    tools = planner.tool_prompt(True)
    refusal = certainly_too_large(planner.params, n_bytes, lambda: planner.engine(
        host.store, recall=False).frame(-1 if thread_id is None else thread_id, tools.text,
                                        tools.native_tokens))
    if refusal:
        raise CliError(f"{refusal}; {outcome}; {TOO_LARGE_REMEDY}", EXIT_TOO_LARGE)


def _print_context(r: dict[str, Any]) -> None:
    from iris_desktop.core.budget_lines import counter_label

    states: dict[str, int] = {}
    for m in r["messages"]:
        states[m["state"]] = states.get(m["state"], 0) + 1
    print(f"window      {r['window']:>8,}  ({r['window_source']}; counted with "
          f"{show_untrusted(counter_label(r['counter']))}"
          + (f"; format {show_untrusted(r['chat_format'])}" if r["chat_format"] else "") + ")")
    print(f"budget      {r['budget']:>8,}  (window × {r['token_budget_ratio']})")
    for label, key in (("system", "system_tokens"), ("tools", "tool_tokens"),
                       ("summary", "summary_tokens"), ("recall", "recall_tokens"),
                       ("history", "history_tokens"),
                       ("draft", "draft_tokens"), ("available", "available"), ("free", "free")):
        print(f"{label:<11} {r[key]:>8,}")
    exact = "exact" if r["prompt_exact"] else "estimated"
    print(f"prompt      {r['predicted_prompt_tokens']:>8,}  (predicted, {exact})")
    print(f"protect     {r['protect_turns']:>8}  turns" + ("  (fallback)" if r["fallback"] else ""))
    print("messages    " + ", ".join(f"{n:,} {s}" for s, n in sorted(states.items())))
    recall = r.get("recall") or {}
    if recall.get("embedder_problem"):
        print(f"warning     {recall['embedder_problem']}")
    if recall.get("ids"):
        reranked = "reranked" if recall.get("reranked") else f"not reranked: {recall.get('rerank_reason')}"
        print(f"recall      {len(recall['ids'])} summarized messages shown with the newest message "
              f"(searched: {show_untrusted(' '.join(recall['terms'][:10]))}; {reranked})")
    elif recall.get("reason") and r["summary_id"] is not None:
        print(f"recall      none ({recall['reason']})")
    due = f"yes ({', '.join(r['triggers'])})" if r["compaction_due"] else "no"
    print(f"compaction  {due}")
    if r.get("dropped"):  # whole sentences: the terminal wraps them, nothing is cut
        print(f"dropped     {show_untrusted(r['dropped']['why'])}")
    if r.get("request") is not None:  # --show-request: the messages, as they are sent
        print("request")
        for message in r["request"]:
            text = message.get("content") or ""
            calls = message.get("tool_calls") or []
            print(f"--- {message['role']}" + (f" ({len(calls)} tool call{'s' if len(calls) != 1 else ''})"
                                              if calls else ""))
            say(text if isinstance(text, str) else dump_json(text))
