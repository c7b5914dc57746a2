"""The hub's token, and where it comes from.

* **The keyring first**: the token saved for this very hub (``iris-desktop models token``,
  Model ▸ Download… ▸ Token…), kept under the hub's ``host:port`` like a server's API
  key. It is the one the user gave Iris, and the window can show and change only it.
* **Then the environment**, as the Hugging Face tools read it: ``HF_TOKEN``, then
  ``HUGGING_FACE_HUB_TOKEN`` (an empty one is none). Only for the Hugging Face hub itself,
  over HTTPS (:data:`HUGGING_FACE`): a ``models.hub_url`` on another host, port or
  scheme (a mirror, a hub of your own, plain ``http://``) never gets it, as those tools'
  token was meant for huggingface.co.

Either token then travels as a keyring token does (``HubClient``): to the hub's own
origin only, never across a redirect that leaves it (the file host) nor to a file list's
next page elsewhere. :class:`HubToken` says where a token came from, for the sentences
that say a token was used or refused."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import httpx

from iris_desktop.keyring_secrets import delete_secret, get_secret, set_secret

from ..remote.address import KEYRING_SERVICE, server_address

log = logging.getLogger("iris.runtime.hub")

#: the only origin (scheme, host, port) a token from the environment is sent to
HUGGING_FACE = ("https", "huggingface.co", 443)
#: the variables the Hugging Face tools read their token from, in their order
TOKEN_VARIABLES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


@dataclass(frozen=True)
class HubToken:
    """A token and where it came from: ``source`` is ``"keyring"``, a variable's name
    (``"HF_TOKEN"``) or ``"given"`` (passed in by the caller)."""

    value: str = field(repr=False)
    source: str = "given"

    @property
    def words(self) -> str:
        """How a sentence names it: "the token saved in the keyring for this hub", "the
        token from HF_TOKEN"."""
        if self.source == "keyring":
            return "the token saved in the keyring for this hub"
        return "the token given" if self.source == "given" else f"the token from {self.source}"

    @property
    def fix(self) -> str:
        """What to do when the hub refuses it (a clause)."""
        if self.source in TOKEN_VARIABLES:
            return (f"set {self.source} to a valid token (a token saved with 'iris-desktop models "
                    "token' or Model ▸ Download… ▸ Token… is used before it)")
        return "save another token ('iris-desktop models token', or Model ▸ Download… ▸ Token…)"


def _token_user(hub_url: str) -> str:
    return f"hub {server_address(hub_url)}"


def get_hub_token(hub_url: str) -> str | None:
    """The token saved in the keyring for the hub at ``hub_url``; None when there is none
    or no usable keyring (said in the log)."""
    try:
        user = _token_user(hub_url)
    except ValueError as exc:
        log.info("keyring: no hub token for %s: %s", hub_url, exc)
        return None
    return get_secret(KEYRING_SERVICE, user, f"the token for {user}")


def set_hub_token(hub_url: str, token: str) -> None:
    """Save ``token`` for the hub (empty: forget it). Raises keyring.errors.KeyringError
    saying why when the keyring refuses, ValueError for an address that is not a URL."""
    user = _token_user(hub_url)
    set_secret(KEYRING_SERVICE, user, token, f"the token for {user}")


def delete_hub_token(hub_url: str) -> None:
    """Forget the hub's token (nothing saved: nothing to do; a keyring that cannot be
    asked is said in the log)."""
    user = _token_user(hub_url)
    delete_secret(KEYRING_SERVICE, user, f"the token for {user}")


def is_hugging_face(hub_url: str) -> bool:
    """``hub_url`` is the Hugging Face hub itself over HTTPS (``https://huggingface.co``,
    any case, port 443 written or not): the one hub a token from the environment goes to."""
    try:  # (url.host decodes IDNA: "xn--a.co" raised from here)
        url = httpx.URL((hub_url or "").strip())
        scheme = url.scheme.lower()
        port = url.port or {"http": 80, "https": 443}.get(scheme)
        return (scheme, url.host.lower().rstrip("."), port) == HUGGING_FACE
    except (httpx.InvalidURL, ValueError, TypeError):  # (UnicodeError is a ValueError)
        return False


def token_variable(hub_url: str) -> str | None:
    """The variable whose token goes to ``hub_url`` when the keyring holds none for it:
    the first of :data:`TOKEN_VARIABLES` that is set and not empty, for the Hugging Face
    hub only; None otherwise."""
    if not is_hugging_face(hub_url):
        return None
    return next((name for name in TOKEN_VARIABLES if _clean(os.environ.get(name))), None)


def hub_token(hub_url: str) -> HubToken | None:
    """The token for the hub at ``hub_url``: the keyring's for it, else (the Hugging Face
    hub over HTTPS only) :func:`token_variable`'s; None when there is none. Raises
    ValueError, one clause naming the variable, for a variable that holds what cannot be
    a token (a space or a character outside printable ASCII): it is not sent."""
    saved = get_hub_token(hub_url) if (hub_url or "").strip() else None
    if saved:
        return HubToken(saved, "keyring")
    name = token_variable(hub_url)
    if name is None:
        return None
    if problem := variable_problem(name):
        raise ValueError(problem)
    return HubToken(_clean(os.environ.get(name)), name)


def variable_problem(name: str) -> str | None:
    """Why the variable ``name`` holds no token that can be sent (a space or a character
    outside printable ASCII), in one clause naming it; None when it can be sent."""
    if all("!" <= c <= "~" for c in _clean(os.environ.get(name))):
        return None
    return (f"{name} holds something that is not a token (a space or a character outside "
            "printable ASCII), so it was not sent; set it to the token as the hub shows it, or "
            "unset it")


def _clean(value: str | None) -> str:
    """A variable's token as the Hugging Face tools read it: line breaks dropped, spaces
    around it stripped ("" when unset)."""
    return (value or "").replace("\r", "").replace("\n", "").strip()
