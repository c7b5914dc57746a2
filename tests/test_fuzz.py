"""A seeded fuzz run over what reaches Iris from outside: files to import, drafts, chat
messages and model replies, tool calls, and damaged database files.

Each test drives the real CLI in-process (``iris_desktop.cli.main``; ``chat`` answers
with a ScriptedRuntime) or the real Sandbox, prints its counts and asserts them:

- crashes must be 0: an exception escaping, a traceback, an exit code outside 0-3;
- writes to a damaged database must be 0: a file PRAGMA quick_check finds damaged is
  never changed (it is set aside as it was, or left in place when not one row of it can
  be read);
- no tool result ever holds the text of a file outside the allowed folder.

The inputs come from ``random.Random(SEED)``, so a failure replays exactly
(``IRIS_FUZZ_SEED`` picks another run). Sizes are bounded: the whole file runs in about
20 s on two cores.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from iris_desktop.cli import main
from iris_desktop.core import store as store_module
from iris_desktop.core.tools import TOOL_NAMES, Sandbox, ToolResult

from conftest import AGENT_FILES, SYNTHETIC_CHAT
from support.fakes import ScriptedRuntime

SEED = int(os.environ.get("IRIS_FUZZ_SEED", "20240607"))
SECRET = "SECRET-OUTSIDE-THE-SANDBOX-7f3a"


@dataclass
class Tally:
    """What one fuzz area tried and how each input ended."""

    area: str
    tried: int = 0
    ok: int = 0
    clear_errors: int = 0
    crashes: list[str] = field(default_factory=list)
    damaged_writes: int = 0

    def report(self, capsys) -> None:
        with capsys.disabled():
            print(f"\nfuzz {self.area}: {self.tried} inputs tried, {self.ok} ok, "
                  f"{self.clear_errors} clear errors, {len(self.crashes)} crashes, "
                  f"{self.damaged_writes} writes to a damaged database")
        assert self.tried > 0 and not self.crashes, self.crashes[:5]
        assert self.damaged_writes == 0


def invoke(tally: Tally, capsys, *argv) -> tuple[int | None, str, str]:
    """Run the CLI once; classify the outcome in ``tally``."""
    tally.tried += 1
    argv = [str(a) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refusing an argument: a usage error
        code = exc.code
    except BaseException as exc:  # noqa: BLE001 - a crash is what this counts
        capsys.readouterr()
        tally.crashes.append(f"{argv[:4]}: {type(exc).__name__}: {str(exc)[:200]}")
        return None, "", ""
    out, err = capsys.readouterr()
    if code not in (0, 1, 2, 3) or "Traceback" in err:
        tally.crashes.append(f"{argv[:4]}: exit {code}: {err[-300:]}")
        return None, out, err
    if code == 0:
        tally.ok += 1
    else:
        tally.clear_errors += 1
    return code, out, err


# -- hostile text --------------------------------------------------------------------------

PIECES = ["hello", "\x00", "\x1b[2J", "\x1b]0;title\x07", "\x9b", "\x7f", "\r", "\t", "\n",
          "é", "😀", "\u202e", "\ufeff", "'", '"', "\\", "{", "[", "</tool_call>", "..",
          "/etc/passwd", "%s", "{{x}}", "<|im_end|>", "<start_of_turn>", " " * 40]


def hostile_text(rng: random.Random, size: int = 40) -> str:
    return "".join(rng.choice(PIECES) if rng.random() < 0.5 else chr(rng.randrange(32, 0x3000))
                   for _ in range(rng.randrange(size)))


def json_string(rng: random.Random) -> str:
    """A JSON string literal with hostile escapes (lone surrogates, NUL, ESC)."""
    escapes = ["\\u0000", "\\ud800", "\\udc00", "\\ud83d\\ude00", "\\u001b", '\\"', "\\n"]
    body = json.dumps(hostile_text(rng))[1:-1]
    return '"' + body + (rng.choice(escapes) if rng.random() < 0.3 else "") + '"'


def json_value(rng: random.Random, depth: int = 0) -> str:
    """JSON text: huge and odd numbers, deep nesting, wrong types."""
    kind = rng.randrange(10)
    if kind == 0 and depth < 3:
        n = rng.choice([10, 500, 1500, 20_000])
        return "[" * n + "]" * n
    if kind == 1:
        return rng.choice(["9" * rng.randrange(1, 6000), "1e400", "-1e-400", "NaN", "-Infinity",
                           "1.5", "-0", "123456789012345678901234567890"])
    if kind == 2:
        return rng.choice(["true", "false", "null"])
    if kind in (3, 4) and depth < 4:
        return "[" + ", ".join(json_value(rng, depth + 1) for _ in range(rng.randrange(4))) + "]"
    if kind == 5 and depth < 4:
        return "{" + ", ".join(f"{json_string(rng)}: {json_value(rng, depth + 1)}"
                               for _ in range(rng.randrange(4))) + "}"
    return json_string(rng)


def json_message(rng: random.Random, calls: list[str]) -> str:
    """One message object, near-valid most of the time."""
    role = rng.choice(["user", "assistant", "tool", "system", "user", "wizard", "USER"])
    fields = {"role": json.dumps(role) if rng.random() < 0.95 else json_value(rng)}
    fields["content"] = json_string(rng) if rng.random() < 0.7 else json_value(rng)
    if role == "assistant" and rng.random() < 0.3:
        call_id = f"c{rng.randrange(1000)}"
        calls.append(call_id)
        fields["tool_calls"] = json.dumps([{"id": call_id, "type": "function", "function": {
            "name": rng.choice([*TOOL_NAMES, "nope"]), "arguments": hostile_text(rng)}}])
    if role == "tool":
        fields["tool_call_id"] = json.dumps(rng.choice(calls) if calls and rng.random() < 0.6
                                            else "never-called")
    if rng.random() < 0.2:
        fields["created_at"] = rng.choice(["1e400", "-5", '"2024-02-30"', '"yesterday"',
                                           "1712345678", '"2024-03-04T19:30:00+01:00"'])
    if rng.random() < 0.2:
        fields[json_string(rng)[1:-1]] = json_value(rng)
    return "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"


def valid_messages(rng: random.Random) -> list[str]:
    """A well-formed conversation whose text is hostile (NUL, ESC, C1, bidi, markup)."""
    out = []
    for turn in range(rng.randrange(1, 5)):
        out.append(json.dumps({"role": "user", "content": hostile_text(rng, 80)}))
        call = {"id": f"c{turn}", "type": "function",
                "function": {"name": "read_file", "arguments": hostile_text(rng)}}
        if rng.random() < 0.5:
            out.append(json.dumps({"role": "assistant", "content": None, "tool_calls": [call]}))
            out.append(json.dumps({"role": "tool", "tool_call_id": f"c{turn}",
                                   "content": hostile_text(rng, 300)}))
        out.append(json.dumps({"role": "assistant", "content": hostile_text(rng, 80),
                               "name": hostile_text(rng, 8)}))
    return out


def hostile_file(rng: random.Random, path: Path) -> Path:
    """A conversation file in one of the shapes an import may meet."""
    calls: list[str] = []
    if rng.random() < 0.4:
        messages = valid_messages(rng)
    else:
        messages = [json_message(rng, calls) for _ in range(rng.randrange(1, 8))]
    shape = rng.randrange(9)
    if shape == 0:
        path.write_bytes(b"")
    elif shape == 1:
        path.write_bytes(rng.randbytes(rng.randrange(1, 4000)))
    elif shape == 2:
        path.write_text("\n".join(messages) + "\n", encoding="utf-8")  # JSONL
    elif shape == 3:
        text = "[" + ", ".join(messages) + "]"
        path.write_text(text[: rng.randrange(len(text))], encoding="utf-8")  # cut short
    elif shape == 4:
        path.write_text(json_value(rng), encoding="utf-8")
    elif shape == 5:
        path.write_text("[" + ", ".join(messages) + "]", encoding="utf-16")
    elif shape == 6:
        title = json_string(rng)
        path.write_text('{"title": ' + title + ', "messages": [' + ", ".join(messages) + "]}",
                        encoding="utf-8")
    else:
        path.write_text("[" + ", ".join(messages) + "]", encoding="utf-8")
    return path


# -- the areas -----------------------------------------------------------------------------


def test_fuzz_import_and_export(capsys, tmp_path):
    rng = random.Random(SEED)
    tally = Tally("import/export")
    data = tmp_path / "data"
    for i in range(300):
        code, out, _ = invoke(tally, capsys, "--data-dir", data, "import",
                              hostile_file(rng, tmp_path / f"in{i}.json"))
        if code == 0:  # what was imported can be exported, exactly, as JSON
            _, exported, _ = invoke(tally, capsys, "--data-dir", data, "export", out.strip())
            json.loads(exported)
    invoke(tally, capsys, "--data-dir", data, "import", tmp_path)  # a folder
    invoke(tally, capsys, "--data-dir", data, "threads", "--no-model")
    tally.report(capsys)
    assert tally.ok > 20 and tally.clear_errors > 20  # both kinds were reached


def test_fuzz_context_drafts(capsys, tmp_path):
    rng = random.Random(SEED + 1)
    tally = Tally("context")
    data = tmp_path / "data"
    for source in (SYNTHETIC_CHAT, AGENT_FILES[0]):
        assert main(["--data-dir", str(data), "import", str(source)]) == 0
    capsys.readouterr()
    for _ in range(70):
        size = rng.choice([0, 10, 200, 5_000, 300_000, 3 * 1024 * 1024])
        draft = (hostile_text(rng, 60) * (size // 40 + 1))[:size]
        if rng.random() < 0.1:
            draft += rng.choice(["\udcff", "\ud800"])  # undecodable argv bytes
        window = rng.choice([512, 1024, 2048, 8192, 65536])
        invoke(tally, capsys, "--data-dir", data, "--set", f"context.window={window}",
               "context", rng.choice(["1", "2", "3", "-1", "999999999999"]), "--no-model",
               f"--draft={draft}", *(["--json"] if rng.random() < 0.5 else []))
    tally.report(capsys)


@pytest.fixture
def sandbox_folders(tmp_path):
    """An allowed folder with files, a symlink out, a loop; a secret outside it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET + "\n")
    allowed = tmp_path / "allowed"
    (allowed / "sub").mkdir(parents=True)
    (allowed / "notes.txt").write_text("line one\nline two\n" * 20)
    (allowed / "sub" / "deep.md").write_text("# deep\n\x1b[2J\n")
    (allowed / "binary.bin").write_bytes(bytes(range(256)))
    (allowed / "out").symlink_to(outside / "secret.txt")
    (allowed / "outdir").symlink_to(outside)
    (allowed / "loop").symlink_to(allowed / "loop")
    return allowed, outside


def tool_arguments(rng: random.Random, outside: Path, name: object = None) -> object:
    """Arguments for a tool call: well-formed for ``name`` half of the time, else any."""
    if name in ("read_file", "list_directory", "search_files") and rng.random() < 0.5:
        path = rng.choice(["notes.txt", "sub", ".", "sub/deep.md", "binary.bin", "out", ".."])
        return {"path": path, **({"pattern": rng.choice(["line", "(a+)+$", "["])}
                                 if name == "search_files" else {})}
    paths = ["notes.txt", "sub", ".", "..", "../outside/secret.txt", str(outside / "secret.txt"),
             "/etc/passwd", "out", "outdir/secret.txt", "loop", "a\x00b", "~", "~root/x",
             "sub/../../outside", "x" * 5000, "\udcff", "", " ", "binary.bin"]
    arguments = {rng.choice(["path", "offset", "limit", "pattern", "command", "junk"]):
                 rng.choice([rng.choice(paths), rng.randrange(-5, 10**12), None, [], {},
                             True, 1.5, "(a+)+$", "[", ".*", SECRET[:6]])
                 for _ in range(rng.randrange(4))}
    if rng.random() < 0.2:
        return rng.choice(["", "{", "null", "[]", json.dumps(arguments), "\x00"])
    return arguments


def test_fuzz_sandbox(capsys, sandbox_folders):
    allowed, outside = sandbox_folders
    rng = random.Random(SEED + 2)
    tally = Tally("sandbox")
    sandbox = Sandbox([str(allowed)], enabled=list(TOOL_NAMES), shell=False)
    for _ in range(400):
        name = rng.choice([*TOOL_NAMES, "read_file", "list_directory", "nope", "", None, 5])
        tally.tried += 1
        try:
            result = sandbox.run(name, tool_arguments(rng, outside, name))
        except BaseException as exc:  # noqa: BLE001
            tally.crashes.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if not isinstance(result, ToolResult) or SECRET in result.content:
            tally.crashes.append(f"{name}: {result!r:.200}")
        elif result.ok:
            tally.ok += 1
        else:
            tally.clear_errors += 1
        result.content.encode("utf-8")  # storable
    tally.report(capsys)
    assert tally.ok > 20 and tally.clear_errors > 20


class Runtime(ScriptedRuntime):
    """A scripted model as Session.load_model returns one."""

    path = Path("scripted.gguf")
    chat_format = SimpleNamespace(name="scripted")

    def close(self) -> None:
        pass


def scripted_reply(rng: random.Random, outside: Path) -> str:
    text = hostile_text(rng, 30)
    if rng.random() < 0.6:
        name = rng.choice([*TOOL_NAMES, "nope", ""])
        call = {"name": name, "arguments": tool_arguments(rng, outside, name)}
        try:
            text += "<tool_call>" + json.dumps(call) + "</tool_call>"
        except (TypeError, ValueError):
            text += "<tool_call>{broken</tool_call>"
    return text


def _nth_chat(data, n: int) -> str:
    """The id of the ``n``-th chat made in ``data`` (``n`` itself when there is none: a
    chat that is not there)."""
    if not (data / "iris.db").exists():
        return str(n)
    with sqlite3.connect(data / "iris.db") as conn:
        ids = [row[0] for row in conn.execute("SELECT id FROM threads ORDER BY id")]
    conn.close()
    return str(ids[n - 1]) if len(ids) >= n else str(n)


def test_fuzz_chat_with_a_scripted_model(capsys, tmp_path, monkeypatch, sandbox_folders):
    allowed, outside = sandbox_folders
    rng = random.Random(SEED + 3)
    tally = Tally("chat")
    replies: list[str] = []
    monkeypatch.setattr("iris_desktop.host.load_runtime",
                        lambda *a, **k: Runtime(list(replies), n_ctx=8192))
    data = tmp_path / "data"
    settings = ["--set", f"tools.allowed_paths={json.dumps([str(allowed)])}",
                "--set", "context.summarizer=extractive"]
    for _ in range(45):
        replies[:] = [scripted_reply(rng, outside) for _ in range(rng.randrange(1, 5))]
        message = hostile_text(rng, 200) * rng.choice([1, 1, 3, 2000])
        window = rng.choice([1024, 2048, 8192])
        where = rng.choice([["--new"], ["--thread", "1"], ["--thread", "2"]])
        if where[0] == "--thread":  # the first or second chat there is (a deleted chat's id
            where = ["--thread", _nth_chat(data, int(where[1]))]  # is not given again)
        invoke(tally, capsys, "--data-dir", data, *settings, "--set", f"context.window={window}",
               "chat", *where, *(["--json"] if rng.random() < 0.3 else []), message)
    tally.report(capsys)
    with sqlite3.connect(data / "iris.db") as conn:
        leaked = conn.execute("SELECT count(*) FROM messages WHERE instr(content, ?)",
                              (SECRET,)).fetchone()[0]
    conn.close()
    assert leaked == 0 and tally.ok > 5


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_fuzz_damaged_databases(capsys, tmp_path):
    rng = random.Random(SEED + 4)
    tally = Tally("damaged database")
    base = tmp_path / "base"
    for source in (SYNTHETIC_CHAT, *AGENT_FILES[:2]):
        assert main(["--data-dir", str(base), "import", str(source)]) == 0
    capsys.readouterr()
    size = (base / "iris.db").stat().st_size
    commands = [["threads", "--no-model"], ["export", "1"], ["context", "1", "--no-model"],
                ["import", str(AGENT_FILES[2])], ["compact", "2", "--no-model"]]
    undetected = 0
    for round_ in range(14):
        data = tmp_path / f"round{round_}"
        shutil.copytree(base, data)
        db = data / "iris.db"
        with open(db, "r+b") as fh:
            for page in rng.sample(range(1, size // 4096), rng.randrange(1, 8)):  # never page 1
                fh.seek(page * 4096 + rng.randrange(0, 4000))
                fh.write(rng.randbytes(rng.randrange(1, 4096)))
        damaged = bool(store_module.quick_check(db, budget_s=60))
        undetected += not damaged
        before = _sha(db)
        for argv in rng.sample(commands, 3):
            invoke(tally, capsys, "--data-dir", data, *argv)
        if damaged:
            asides = [p for p in data.glob("iris.db.corrupt-*")
                      if not p.name.endswith(("-wal", "-shm"))]
            # set aside as it was, or left in place, unchanged, when no row of it could be read
            tally.damaged_writes += _sha(asides[0] if asides else db) != before
    tally.report(capsys)
    with capsys.disabled():
        print(f"fuzz damaged database: {14 - undetected} damaged files, {undetected} whose "
              "damage PRAGMA quick_check cannot see (unused bytes)")
