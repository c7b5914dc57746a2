"""Where the conversation goes, and the key it goes with: a base URL's scheme, host and
port, whether the server is on this computer, what the UI must say before sending to it,
and the server's API key in the OS keyring (kept under its ``host:port``, never in the
settings or the log)."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from iris_desktop.keyring_secrets import delete_secret, get_secret, set_secret

from ..errors import ServerError

#: the keyring service; the user name is the server's ``host:port``
KEYRING_SERVICE = "iris-desktop"


def _split(base_url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of ``base_url``; raises ValueError for anything but an
    http(s) URL with a host."""
    parts = urlsplit(base_url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not a server address: {base_url!r} (expected http://host:port "
                         f"or https://host)")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"not a server address: {base_url!r} (bad port)") from None
    return parts.scheme, parts.hostname.lower(), port


def refuse_query(base_url: str) -> None:
    """Raises ServerError for a base URL with a query string or a fragment (``?api_key=…``):
    Iris builds every path from the base URL, so the query would be dropped or mangled
    (a server answered "no OpenAI-compatible API here"), and a key in it belongs in the
    keyring. The message leaves the query out: it may be a key."""
    parts = urlsplit(base_url.strip())
    if parts.query or parts.fragment:
        address = server_address(base_url)
        raise ServerError(f"the server address for {address} has a query string or fragment "
                         f"(after ? or #), which Iris does not send; remove it (an API key goes "
                         f"in Model ▸ Server…, kept in the system keyring, and is sent as a "
                         f"bearer token)")


def server_address(base_url: str) -> str:
    """``host:port`` of ``base_url`` (``[::1]:8080`` for IPv6), the default port filled in:
    the key the API key is kept under, and the name the UI shows."""
    _, host, port = _split(base_url)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback(base_url: str) -> bool:
    """The server is on this machine: ``localhost``, 127.0.0.0/8 or ::1."""
    host = _split(base_url)[1]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost
        return False


def privacy_warning(base_url: str) -> str | None:
    """What the UI must say before sending to ``base_url``, or None: plain ``http://`` to
    another machine carries the conversation and the key unencrypted."""
    scheme = _split(base_url)[0]
    if scheme == "https" or is_loopback(base_url):
        return None
    return (f"{server_address(base_url)} is reached over plain http: your conversation and "
            f"API key cross the network unencrypted. Use https:// unless this network is "
            f"yours alone.")


def get_api_key(base_url: str) -> str | None:
    """The API key saved for ``base_url``'s server; None when there is none, or when this
    system has no usable keyring (said in the log)."""
    address = server_address(base_url)
    return get_secret(KEYRING_SERVICE, address, f"the API key for {address}")


def set_api_key(base_url: str, key: str) -> None:
    """Save ``key`` for ``base_url``'s server in the OS keyring (an empty key deletes it).
    Raises keyring.errors.KeyringError saying why when the keyring refuses."""
    address = server_address(base_url)
    set_secret(KEYRING_SERVICE, address, key, f"the API key for {address}")


def delete_api_key(base_url: str) -> None:
    """Forget the API key of ``base_url``'s server (nothing saved: nothing to do; a keyring
    that cannot be asked is said in the log)."""
    address = server_address(base_url)
    delete_secret(KEYRING_SERVICE, address, f"the API key for {address}")


def clean_api_key(base_url: str, key: str | None) -> str | None:
    """``key`` without the spaces and line ends around it (pasted keys often carry one),
    None when nothing is left. Raises ServerError when what is left cannot be sent as a
    bearer token (anything but printable ASCII, or a space inside): the sentence never
    repeats the key (before, httpx's error quoted the header, key and all, into the
    dialog, the terminal and the log)."""
    key = (key or "").strip()
    if not key:
        return None
    if not all("!" <= c <= "~" for c in key):
        raise ServerError(f"the API key for {server_address(base_url)} has characters an HTTP "
                          f"header cannot carry; type it again in Model ▸ Server…")
    return key
