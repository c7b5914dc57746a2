"""The one keyring wrapper: a missing, locked or broken keyring gives None, False or a
one-clause error, logged, never a traceback; the callers keep their own names."""

import logging

import keyring
import pytest
from keyring.backend import KeyringBackend
from keyring.backends.fail import Keyring as NoKeyring
from keyring.errors import KeyringError, KeyringLocked, PasswordSetError

from iris_desktop.keyring_secrets import delete_secret, get_secret, set_secret
from iris_desktop.runtime.hub import get_hub_token, set_hub_token
from iris_desktop.runtime.remote import delete_api_key, get_api_key, set_api_key

from support.hub_server import MemoryKeyring


class Failing(KeyringBackend):
    """A keyring whose every call raises ``error``."""

    priority = 1

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def get_password(self, service, username):
        raise self.error

    def set_password(self, service, username, password):
        raise self.error

    def delete_password(self, service, username):
        raise self.error


@pytest.fixture
def use():
    before = keyring.get_keyring()
    yield keyring.set_keyring
    keyring.set_keyring(before)


def test_no_keyring_reads_none_forgets_nothing_and_refuses_to_keep_in_one_clause(use, caplog):
    use(NoKeyring())
    caplog.set_level(logging.INFO, "iris.keyring")
    assert get_secret("s", "u", "the secret") is None
    assert delete_secret("s", "u", "the secret") is True  # nothing can have been kept
    set_secret("s", "u", "", "the secret")  # forgetting: nothing to do
    with pytest.raises(PasswordSetError, match="^this computer has no keyring$"):
        set_secret("s", "u", "sk-secret", "the secret")
    assert "keyring: cannot keep the secret: this computer has no keyring" in caplog.text
    assert "sk-secret" not in caplog.text


@pytest.mark.parametrize("error, said", [
    (KeyringLocked("Failed to unlock the collection!"), "the keyring is locked"),
    (KeyringError("D-Bus said no"), "the keyring refused (D-Bus said no)"),
    (OSError("the D-Bus connection was closed"),
     "the keyring cannot be used (OSError: the D-Bus connection was closed)"),
])
def test_a_locked_or_broken_keyring_is_said_not_raised(use, caplog, error, said):
    use(Failing(error))
    assert get_secret("s", "u", "the secret") is None
    assert delete_secret("s", "u", "the secret") is False
    for value in ("sk-secret", ""):  # keeping, and forgetting through set
        with pytest.raises(KeyringError) as raised:
            set_secret("s", "u", value, "the secret")
        assert str(raised.value) == said
    assert f"keyring: cannot read the secret: {said}" in caplog.text
    assert "sk-secret" not in caplog.text


def test_the_callers_keep_their_service_and_user_names(use):
    memory = MemoryKeyring()
    use(memory)
    set_api_key("https://api.example.com/v1", "sk-a")
    set_hub_token("https://huggingface.co", "hf_b")
    assert memory.passwords == {("iris-desktop", "api.example.com:443"): "sk-a",
                                ("iris-desktop", "hub huggingface.co:443"): "hf_b"}
    assert get_api_key("https://api.example.com") == "sk-a"
    assert get_hub_token("https://huggingface.co/") == "hf_b"
    delete_api_key("https://api.example.com")
    set_hub_token("https://huggingface.co", "")
    assert memory.passwords == {}
    assert get_hub_token("not a url") is None


def test_a_caller_without_a_keyring_reads_none(use):
    use(NoKeyring())
    assert get_api_key("http://127.0.0.1:8080") is None
    assert get_hub_token("https://huggingface.co") is None
    delete_api_key("http://127.0.0.1:8080")  # nothing to forget: no error
    with pytest.raises(KeyringError, match="no keyring"):
        set_api_key("http://127.0.0.1:8080", "sk-a")
