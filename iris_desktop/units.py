"""Sizes in words, one convention for every face (the window, the CLI, the log's
sentences): a file's size in decimal units, as the download shows it and as the file
manager and the disk's label count ("491 MB", "2.10 GB"); memory, the computer's and a
GPU's, in units of 2**30 and 2**20 bytes named GB and MB, as memory is sold ("16 GB",
"7.5 GB", "572 MB"). llama.cpp's own log lines (MiB) are quoted as they are."""

from __future__ import annotations

GB = 10**9
MB = 10**6
MEMORY_GB = 2**30
MEMORY_MB = 2**20


def file_size(n: int | float, gb_digits: int = 2, mb_digits: int = 0) -> str:
    """A file's size: "2.10 GB", "491 MB", "12 kB", "100 bytes"."""
    if n >= GB:
        return f"{n / GB:,.{gb_digits}f} GB"
    if n >= MB:
        return f"{n / MB:,.{mb_digits}f} MB"
    if n >= 1_000:
        return f"{n / 1_000:,.0f} kB"
    return f"{int(n):,} bytes"


def memory_size(n: int | float, digits: int = 1) -> str:
    """Memory as it is sold: "16 GB" (of 2**30 bytes), "7.5 GB" (``digits`` decimals below
    10 GB, none from there, "8 GB" not "8.0 GB"), "572 MB" under 1 GB."""
    if n < MEMORY_GB:
        return f"{n / MEMORY_MB:,.0f} MB"
    gb = n / MEMORY_GB
    if gb >= 9.95 or not digits:
        return f"{gb:,.0f} GB"
    return f"{gb:.{digits}f}".rstrip("0").rstrip(".") + " GB"
