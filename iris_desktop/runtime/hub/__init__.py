"""The model hub: find a GGUF on Hugging Face (or a hub that speaks its HTTP API) and
download it so that nothing half-written or altered is ever loaded.

Only when the user asks (Model ▸ Download…, ``iris-desktop models search`` and
``models download``) does Iris contact the hub, at the setting ``models.hub_url``
(default https://huggingface.co). Three endpoints are used, with httpx:

* ``GET /api/models?search=TEXT&filter=gguf`` — repositories that hold GGUF files;
* ``GET /api/models/{repo}/tree/{revision}?recursive=true`` — a repository's files, with
  their sizes and, for LFS files, their sha256 (``lfs.oid``); pages follow ``Link: next``
  on the hub's own scheme, host and port only (another address is refused: the token
  would go there), within 16 MiB and 50,000 entries in all;
* ``GET /{repo}/resolve/{revision}/{file}`` — the file, after a redirect to the file host
  (Hugging Face's CDN), with ``Range`` to resume.

What is sent: the search text, the repository and file names, and the token when the user
saved one (OS keyring, like a server's API key) or, for https://huggingface.co only and
when the keyring holds none, the one in ``HF_TOKEN`` (then ``HUGGING_FACE_HUB_TOKEN``), as
the Hugging Face tools read it (:mod:`.token`); it goes to the hub only: httpx drops it
when the redirect leaves the hub's origin. The usual proxy variables (``HTTPS_PROXY``,
``HTTP_PROXY``, ``ALL_PROXY``, ``NO_PROXY``) are honoured here, for people behind a
proxy; a local model server (``runtime.remote``) stays proxy-free.

A download (:func:`download`) goes to ``<models>/downloads/<org>/<repo>/<path>``, the
file's folders in the repository kept (every part checked to be a plain name), where the
model library lists it under the source ``download``:

1. the file's size and sha256 come from the hub's tree first;
2. the free space is checked before a byte is written;
3. bytes go to ``<file>.gguf.partial`` (0600) beside a small ``.partial.json`` record
   (repo, revision, size, sha256); Stop, a crash or a lost connection leave it, and the
   next download of the same file resumes it with ``Range`` (a lost connection is resumed
   at once, a few times; Stop is heard at once, even from a silent file host, and a
   stall is named after ``downloading.STALL_S``); a web page (a login page) or bytes
   that do not start with ``GGUF`` are never written;
4. the whole file's sha256 must equal the hub's, and its GGUF header must read as any
   opened model's (:func:`~.gguf.read_gguf_info`), before it gets its name (fsynced,
   renamed, the folder fsynced);
5. what was verified is recorded in ``<models>/downloads/.records/<org>/<repo>/<path>.json``
   (the repository path, revision, sha256, size and mtime): a file already there counts
   as downloaded only when its own recorded sha256 (hashed again when the file changed
   or has no record) equals the sha256 the hub lists for that exact path and revision.
   When the hub lists no sha256, the file's is computed and recorded, and the download
   is "not verified by the hub" (:func:`download_record`).

A listing with a size of 0 or less, or a sha256 that is not 64 hexadecimal digits, is
refused before anything is written. Two downloads of one file (two windows, a window
and the command line) never write one ``.partial``: a lock file
(``.records/…/<file>.lock``, ``flock`` on POSIX, ``msvcrt.locking`` on Windows) makes
the second wait, saying so, until the first ends, then find the file there. A search or
file list is read whole within :data:`MAX_LISTING_BYTES` and
:data:`LISTING_TIMEOUT_S` (``runtime.http``), so a broken or hostile hub can neither
fill the memory nor hold the dialog.

Every failure is a :class:`HubError`: one sentence, a ``kind`` (``network``, ``http``,
``auth``, ``not_found``, ``no_space``, ``disk_full``, ``checksum``, ``not_gguf``,
``stopped``, ``write``, ``address``, ``answer``, ``busy``) and the partial file, kept for
the user to resume or remove (:func:`discard_partial`, which takes the download's lock: it
refuses, kind ``busy``, while that file downloads in another window or command).

The package, one idea a module: :mod:`.client` (the hub's HTTP API, the listings and
their validation, :class:`HubError`), :mod:`.token` (the hub's token and where it came
from), :mod:`.catalog` (the recommended models and whether one fits this computer's
memory), :mod:`.records` (where a download goes, its partial file and what was verified
of it), :mod:`.lock` (one download of a file at a time), :mod:`.downloading` (download,
resume, verify, name) and :mod:`.progress` (how far a download is). The names below are
the ones used outside it.
"""

from __future__ import annotations

from ..cpu import system_memory_bytes
from .catalog import CHAT_PIPELINES, RECOMMENDED, Recommended, fits_in_memory, not_for_chat, not_for_chat_words
from .client import HubClient, HubError, HubFile, HubRepo
from .downloading import download
from .lock import discard_partial
from .progress import DownloadProgress
from .records import download_record, download_target, name_problem, partial_state, verified_words
from .token import HubToken, get_hub_token, hub_token, set_hub_token, token_variable, variable_problem

__all__ = [
    "CHAT_PIPELINES",
    "RECOMMENDED",
    "DownloadProgress",
    "HubClient",
    "HubError",
    "HubFile",
    "HubRepo",
    "HubToken",
    "Recommended",
    "discard_partial",
    "download",
    "download_record",
    "download_target",
    "fits_in_memory",
    "get_hub_token",
    "hub_token",
    "name_problem",
    "not_for_chat",
    "not_for_chat_words",
    "partial_state",
    "set_hub_token",
    "system_memory_bytes",
    "token_variable",
    "variable_problem",
    "verified_words",
]
