"""The log never fails a command: a full disk at exit gave the CLI a traceback and exit 1
(``PrivateLogFile.close`` raised ENOSPC writing the last warnings). A real small file
system, filled."""

from __future__ import annotations

import logging

from iris_desktop.logfile import PrivateLogFile

from support.faults import full_disk


def test_a_log_on_a_full_disk_flushes_and_closes_without_a_word(tmp_path):
    with full_disk(tmp_path, "1m") as disk:
        handler = PrivateLogFile(disk.path / "logs" / "iris.log")
        logger = logging.getLogger("iris.test-full-disk")
        logger.addHandler(handler)
        logger.propagate = False
        try:
            logger.warning("before the disk fills")
            disk.fill()
            for n in range(200):  # more than the stream's buffer: a write must fail
                logger.warning("the disk is full now, line %d %s", n, "x" * 200)
            handler.flush()
        finally:
            logger.removeHandler(handler)
            handler.close()  # raised OSError (ENOSPC) before
        assert handler.stream is None
