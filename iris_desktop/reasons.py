"""Why an exception happened, in words for the user (one place for the CLI, the host,
the self-test and the agent's "The model failed: …")."""

from __future__ import annotations

from pathlib import Path

#: exceptions that only a bug in Iris raises: their text ("'content'", "'NoneType' object
#: has no attribute 'get'") tells a user nothing, so a message says "a bug" and where the
#: log with the details is
BUGS = (AttributeError, LookupError, TypeError, NameError, AssertionError, ZeroDivisionError)


def plain_reason(exc: BaseException, log_path: Path | None = None) -> str:
    """Why ``exc`` happened, in words for the user: an OSError's reason and file, a bug
    named as one (with where the log is), otherwise the exception's own sentence."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror + (f" ({exc.filename})" if exc.filename else "")
    text = " ".join(str(exc).split())
    if isinstance(exc, BUGS) or not text:
        where = f" (details in {log_path})" if log_path is not None else ""
        return f"an internal error in Iris ({type(exc).__name__}: {text or 'no message'}){where}"
    return text


