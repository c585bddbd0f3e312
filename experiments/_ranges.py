"""What the read-shape experiments (folio_sizes, populate_vs_sendfile, warm_folios) share: threads
that take a file's pieces in order, the device's rate by fio in each round, a cell's CPU seconds.

Imported as ``from _ranges import ...``: Python puts a script's own folder first on sys.path.
"""
from __future__ import annotations

import resource
import threading
from pathlib import Path
from typing import Callable

from coldstart.bench.weights import fio_run
from coldstart.warm.residency import evict_all


def pieces(size: int, piece: int) -> list[tuple[int, int]]:
    """(offset, length) of ``size`` bytes cut into ``piece``-byte pieces, in file order."""
    return [(o, min(piece, size - o)) for o in range(0, size, piece)]


def over_threads(threads: int, work: list[tuple[int, int]], fn: Callable[[int, int], None]) -> None:
    """Run ``fn(offset, length)`` over ``work`` in ``threads`` threads, each taking the next piece in
    order (as the warmers' readers take a plan's ranges and the map reload its pieces)."""
    todo = list(reversed(work))
    lock = threading.Lock()

    def loop():
        while True:
            with lock:
                if not todo:
                    return
                o, n = todo.pop()
            fn(o, n)

    ths = [threading.Thread(target=loop) for _ in range(threads)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()


def device_gib_s(path: Path, shapes: tuple[tuple[int, int], ...]) -> float:
    """The fastest of fio's cold reads of ``path`` over ``shapes`` ((O_DIRECT?, block bytes), 4 jobs)."""
    best = 0.0
    for direct, bs in shapes:
        evict_all([path])
        nb, secs = fio_run(path, direct, 4, bs)
        best = max(best, nb / secs / 2**30)
    return best


def cpu_seconds() -> float:
    """This process's user + system CPU seconds so far (the faults' kernel work is charged to it)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime
