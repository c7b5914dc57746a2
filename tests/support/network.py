"""Fixtures for tests that reach the network on loopback: no proxy from the developer's
shell (a loopback server must be reached directly, by subprocesses too), a keyring in
memory (or none at all), and a record of every address the process connects to or looks
up. Loaded as a
pytest plugin by ``tests/conftest.py``; a module asks for the first with
``pytestmark = pytest.mark.usefixtures("no_proxy_no_keyring")``."""

from __future__ import annotations

import socket

import keyring
import pytest

from support.hub_server import MemoryKeyring

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy",
              "all_proxy", "no_proxy")


@pytest.fixture
def no_proxy_no_keyring(monkeypatch):
    """No proxy variable, and a keyring in memory (the system's is never touched)."""
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
    before = keyring.get_keyring()
    keyring.set_keyring(MemoryKeyring())
    yield
    keyring.set_keyring(before)


@pytest.fixture
def no_keyring(monkeypatch):
    """No keyring, whatever the developer's machine has (a test may plug in its own, as
    :func:`memory_keyring` does); subprocesses get none either."""
    from keyring.backends.fail import Keyring as Fail

    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.fail.Keyring")
    previous = keyring.get_keyring()
    keyring.set_keyring(Fail())
    yield
    keyring.set_keyring(previous)


def memory_keyring() -> dict[tuple[str, str], str]:
    """A keyring in memory plugged in (the keyring package's own extension point; it
    refuses to delete what it does not hold, as real keyrings do): its passwords by
    (service, user)."""
    memory = MemoryKeyring()
    keyring.set_keyring(memory)
    return memory.passwords


@pytest.fixture
def connects(monkeypatch):
    """Every address this process connects a socket to (or looks up), from now on."""
    seen: list = []
    connect, connect_ex, lookup = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo

    def record_connect(self, address):
        seen.append(address)
        return connect(self, address)

    def record_connect_ex(self, address):
        seen.append(address)
        return connect_ex(self, address)

    def record_lookup(host, *args, **kwargs):
        seen.append(("lookup", host))
        return lookup(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", record_connect)
    monkeypatch.setattr(socket.socket, "connect_ex", record_connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", record_lookup)
    return seen
