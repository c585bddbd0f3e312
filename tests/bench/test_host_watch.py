"""A benchmark's host line names what else ran: a busy process outside the benchmark is seen, the
benchmark's own children are not."""
from __future__ import annotations

import subprocess
import sys
import time

from coldstart.bench.host import HostWatch


def test_a_busy_process_outside_the_benchmark_is_named_and_its_own_child_is_not() -> None:
    # the outer shell exits at once: its busy child is re-parented, no longer this process's descendant
    subprocess.run(["sh", "-c", "(exec timeout 4 sh -c 'while :; do :; done') >/dev/null 2>&1 &"], check=True)
    own = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 6\nwhile time.time() < end: pass"])
    w = HostWatch(every=0.5, min_cores=0.2).start()
    try:
        time.sleep(2.6)
    finally:
        w.stop()
        own.kill()
        own.wait()
    names = " ".join(w.heavy)
    assert "sh (" in names, w.heavy
    assert f"({own.pid})" not in names
    text = w.describe()
    assert "load average (1 min) over the run" in text and "sh (" in text


def test_an_idle_watch_says_none_seen() -> None:
    w = HostWatch(every=0.2, min_cores=50.0).start()  # nothing uses 50 cores
    time.sleep(0.5)
    w.stop()
    assert "none seen" in w.describe()
