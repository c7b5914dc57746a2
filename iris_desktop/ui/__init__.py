"""The Qt user interface: widgets and workers only; all logic lives in ``iris_desktop.core``."""

import ctypes
import sys

if sys.version_info < (3, 12):
    # PySide6 6.12 hands out None, True and False without taking a reference (void calls,
    # invalid QVariants, bool signal arguments): it assumes 3.12's immortal singletons. On
    # 3.11 their refcounts fall to 0 and Python aborts ("none_dealloc"/"bool_dealloc").
    # Make them as immortal as 3.12 does; they are never freed anyway.
    for _singleton in (None, True, False):
        ctypes.c_ssize_t.from_address(id(_singleton)).value += 1 << 40
