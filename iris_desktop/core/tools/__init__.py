"""Sandboxed local tools the model may call.

A :class:`Sandbox` owns the user's tool settings (allowed folders, enabled tools, shell
switch, shell confirmation) and runs one tool call at a time. Contracts:

* :meth:`Sandbox.run` never raises. A refusal or failure comes back as
  ``ToolResult(ok=False, content="error: ...")``, phrased for the model to read.
* File tools only touch paths that, after ``resolve()`` (symlinks followed), lie inside
  one of the resolved allowed folders. Relative paths start at the first allowed folder.
  Directory recursion never follows symlinks, and a symlinked file is only read when its
  target is inside the allowed folders. The checked path is then opened without following
  any link (see :mod:`.safe_files`), so swapping a name for a link meanwhile cannot
  lead outside.
* File tools stop at their next file, line or entry once the ``cancel`` event passed to
  :meth:`Sandbox.run` is set. A search also stops after :data:`SEARCH_TIME_LIMIT_S`, or
  when the pattern takes over :data:`REGEX_LINE_TIME_LIMIT_S` on one line (the regex
  engine releases the GIL meanwhile); it then says it was cut short. Memory is bounded
  too: a pattern whose repeats would be written out past :data:`MAX_PATTERN_REPEAT` or
  :data:`MAX_PATTERN_SIZE` is refused before it is compiled, and on Linux the search runs
  in a forked child under an address-space limit (:data:`SEARCH_MEMORY_BYTES` on top of
  what the app maps), where running out is a tool error.
* A refusal never says where a link leads outside the allowed folders ("is a link that
  leads outside the allowed folders"): with a server backend, tool output is sent there.
* ``run_shell``'s confirmation is shown with ``iris_desktop.untrusted.show_untrusted``:
  controls, bidi overrides and other invisible characters as escapes, so what is
  approved is what runs.
* Text is UTF-8. Binary files (a NUL byte in the first 8 KiB) and files that are not
  valid UTF-8 are reported as such, never decoded into garbage.
* Output is never shortened except at a hard cap of :data:`MAX_OUTPUT_BYTES` UTF-8 bytes,
  marked with ``[output truncated at N bytes of M]``, and ``read_file`` lines over
  :data:`MAX_READ_LINE_BYTES`, marked with ``[line cut at N of M bytes]``. ``read_file``
  reads only as far as the lines it shows, except that it counts the lines of files up to
  :data:`LINE_COUNT_MAX_BYTES`; memory stays bounded however long a line is.
* Paths in output are relative to the first allowed folder when under it (so they can be
  passed straight back to a tool), absolute otherwise.
* ``run_shell`` is off unless ``shell=True`` *and* it is enabled, and every call asks
  ``confirm_shell(command)`` first; only ``True`` lets it run. It runs in the first
  allowed folder (the home folder when there is none), in its own process group so a
  timeout kills everything it started. A command that ran is ``ok`` whatever its exit code.
* Nothing here opens a network connection.

The parts, one idea each: :mod:`.limits` (the limits and messages, ToolError, ToolResult),
:mod:`.specs` (the tools and their arguments), :mod:`.sandbox` (the settings, the
definitions, one call's dispatch), :mod:`.safe_files` (resolving and opening inside the
allowed folders), :mod:`.text` (capped output, binary files, lines), :mod:`.files`
(``read_file``, ``list_directory``), :mod:`.search` (``search_files``), :mod:`.patterns`
(the pattern's memory guard), :mod:`.worker` (the search's memory-limited process) and
:mod:`.shell` (``run_shell``). Each reads a limit as ``limits.NAME`` when it uses it, so a
test lowers a limit on :mod:`.limits`.
"""

from iris_desktop.core.tools.limits import ToolError, ToolResult
from iris_desktop.core.tools.sandbox import Sandbox
from iris_desktop.core.tools.specs import TOOL_NAMES

__all__ = ["TOOL_NAMES", "Sandbox", "ToolError", "ToolResult"]
