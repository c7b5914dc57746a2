"""The chat list's cost on many chats: its whole fill (``ThreadPanel.show_threads``) and
the second line that tells chats of one title apart (``threads.told_apart``, session 61),
on
  A: 1,000 chats of which 300 share one title ("Python help"), and
  B: 5,000 chats of distinct titles;
median of 20 calls each, offscreen.

    .venv/bin/python bench/chat_list_cost.py
    .venv/bin/python bench/versus.py --old e3d6919 -- bench/chat_list_cost.py

(a checkout from before ``told_apart`` measures the fill alone: its list had no second
line.)"""
import os
import statistics
import sys
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
from PySide6.QtWidgets import QApplication  # noqa: E402

from iris_desktop.ui import threads as module  # noqa: E402

NOW = 1_796_000_000.0  # a fixed "now" (Dec 2026)
CALLS = 20


def chats_a():
    out = []
    for i in range(1000):
        if i < 300:
            # 300 of one title: every 3 share a minute (their date line is the same), and
            # of those every 2nd pair has the same count too (then the number tells them apart)
            stamp = NOW - 3600 * 24 * (i // 30) - 60 * (i // 3)
            count = 40 + (i // 3) if i % 3 else 40 + (i // 3) + (i % 2)
            out.append({"id": i + 1, "title": "Python help", "updated_at": stamp,
                        "messages": count, "branch_messages": count})
        else:
            out.append({"id": i + 1, "title": f"Chat about topic {i}", "updated_at": NOW - 97 * i,
                        "messages": 10 + i % 50, "branch_messages": 10 + i % 50})
    return out


def chats_b():
    return [{"id": i + 1, "title": f"Distinct chat {i}", "updated_at": NOW - 61 * i,
             "messages": 5 + i % 300, "branch_messages": 5 + i % 300} for i in range(5000)]


def median_ms(fn):
    times = []
    for _ in range(CALLS):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main():
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    app = QApplication.instance() or QApplication(sys.argv[:1])
    side = "new" if hasattr(module, "told_apart") else "old"
    panel = module.ThreadPanel()
    for name, chats in (("A 1,000 chats, 300 of one title", chats_a()),
                        ("B 5,000 distinct titles", chats_b())):
        if side == "new":
            lines = module.told_apart(chats, NOW)
            ms = median_ms(lambda c=chats: module.told_apart(c, NOW))
            kinds = {"date": 0, "date+count": 0, "date+count+number": 0}
            for text in lines.values():
                kinds["date+count+number" if "chat #" in text else
                      "date+count" if "message" in text else "date"] += 1
            print(f"{name}: told_apart {ms:.3f} ms; second lines {len(lines)} {kinds}")
        fill = median_ms(lambda c=chats: panel.show_threads(c))
        print(f"{name}: show_threads {fill:.3f} ms ({side}, {panel.list.count()} rows)")
    del app


if __name__ == "__main__":
    main()
