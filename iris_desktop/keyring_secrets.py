"""The OS keyring, where Iris keeps its secrets: a model server's API key
(``runtime.remote``), a hub's token (``runtime.hub``) and the chat history's key
(``storage_key``). Each caller keeps its own service and user names; this module says
once what happens when the keyring cannot help (none on this computer, a locked one,
a broken backend such as a D-Bus that went away):

* :func:`get_secret` gives None, as if nothing were kept;
* :func:`delete_secret` leaves nothing to do when nothing is kept or there is no
  keyring, and returns False when the keyring could not be asked;
* :func:`set_secret` raises ``keyring.errors.PasswordSetError`` (a ``KeyringError``)
  whose message says why in one clause ("this computer has no keyring").

Each failure is logged, naming the secret but never its value; none is a traceback.
The ``keyring`` package is imported on first use (loading it takes tens of
milliseconds, and most runs never need it).
"""

from __future__ import annotations

import logging

log = logging.getLogger("iris.keyring")

__all__ = ["delete_secret", "get_secret", "read_secret", "set_secret"]


def get_secret(service: str, user: str, what: str) -> str | None:
    """The secret kept under ``service`` and ``user``; None when there is none, or when
    the keyring cannot be read (said in the log; ``what`` names the secret there, as in
    "the API key for example.com:443")."""
    return read_secret(service, user, what)[0]


def read_secret(service: str, user: str, what: str) -> tuple[str | None, str | None]:
    """(the secret, None), or (None, why the keyring could not be read) for a keyring
    that is there but locked or broken, as "the keyring is locked"; (None, None) when
    nothing is kept, or this computer has no keyring."""
    try:
        import keyring

        return keyring.get_password(service, user), None
    except Exception as exc:  # no keyring, a locked one, a broken backend
        _log_failure(f"cannot read {what}", exc)
        return None, None if _quiet(exc) else _reason(exc)


def keyring_present() -> bool:
    """Whether this computer has a keyring to keep secrets in (not keyring's "fail"
    backend, which is what it picks when there is none)."""
    try:
        import keyring
        from keyring.backends import fail

        return not isinstance(keyring.get_keyring(), fail.Keyring)
    except Exception:  # the package cannot load: no keyring
        return False


def set_secret(service: str, user: str, value: str, what: str) -> None:
    """Keep ``value`` under ``service`` and ``user`` (an empty one: forget what is kept).
    Raises ``keyring.errors.PasswordSetError`` saying why in one clause when the keyring
    does not keep it (or cannot forget it); logged too."""
    if not value:
        problem = _forget(service, user)
        if problem is not None:
            _log_failure(f"cannot forget {what}", problem)
            raise _refusal(_reason(problem)) from None
        return
    try:
        import keyring

        keyring.set_password(service, user, value)
    except Exception as exc:  # no keyring, a locked one, a broken backend
        _log_failure(f"cannot keep {what}", exc)
        raise _refusal(_reason(exc)) from None


def delete_secret(service: str, user: str, what: str) -> bool:
    """Forget what is kept under ``service`` and ``user``. True when nothing is kept there
    now (forgotten, nothing was kept, or no keyring could have kept it); False when the
    keyring could not be asked (a locked one, a broken backend: said in the log)."""
    problem = _forget(service, user)
    if problem is None:
        return True
    _log_failure(f"cannot forget {what}", problem)
    return False


def _forget(service: str, user: str) -> Exception | None:
    """Delete the entry; None when nothing is kept there now, else what went wrong."""
    try:
        import keyring
        from keyring.errors import NoKeyringError, PasswordDeleteError
    except ImportError:
        return None  # no keyring package: nothing can have been kept
    try:
        keyring.delete_password(service, user)
    except (PasswordDeleteError, NoKeyringError):  # nothing kept, or nowhere to keep it
        return None
    except Exception as exc:
        return exc
    return None


def _reason(exc: Exception) -> str:
    """Why the keyring could not help, in one clause."""
    if isinstance(exc, ImportError):
        return "the keyring package cannot be loaded"
    from keyring.errors import KeyringError, KeyringLocked, NoKeyringError

    if isinstance(exc, NoKeyringError):
        return "this computer has no keyring"
    if isinstance(exc, KeyringLocked):
        return "the keyring is locked"
    said = (str(exc).strip().splitlines() or [""])[0][:200]
    if isinstance(exc, KeyringError):
        return f"the keyring refused ({said or type(exc).__name__})"
    return f"the keyring cannot be used ({type(exc).__name__}{': ' + said if said else ''})"


def _log_failure(doing: str, exc: Exception) -> None:
    """One line in the log: info for a computer without a keyring (expected on a headless
    system), a warning for anything else."""
    log.log(logging.INFO if _quiet(exc) else logging.WARNING, "keyring: %s: %s", doing,
            _reason(exc))


def _quiet(exc: Exception) -> bool:
    """No keyring at all (expected on a headless system), not one that failed."""
    return isinstance(exc, ImportError) or _reason(exc) == "this computer has no keyring"


def _refusal(reason: str) -> Exception:
    """The error :func:`set_secret` raises: keyring's own ``PasswordSetError``, so that a
    caller catching ``KeyringError`` catches it."""
    try:
        from keyring.errors import PasswordSetError
    except ImportError:
        return RuntimeError(reason)
    return PasswordSetError(reason)
