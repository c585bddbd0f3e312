"""Turn a CRIU log into the one or two lines a user needs (not the 300 around them).

CRIU prefixes every failure with ``Error (file:line):``; the first one is usually the cause and
the last one what CRIU gave up on. Restorer-blob lines carry a ``PID:`` prefix; timestamps are
noise in a one-line error, so both are stripped.
"""
from __future__ import annotations

import re
from pathlib import Path

_STAMP = re.compile(r"^\(\s*[\d.]+\)\s*")
_PID = re.compile(r"^\d+:\s+")
_ERROR = re.compile(r"\bError \(([^)]*)\):\s*(.*)")
# lines that follow a real failure but say nothing about it
# "Error" lines CRIU logs and then carries on from (not the cause of a failure), and the generic
# last words of a failed run
_BENIGN = re.compile(r"(Can't setup RLIMIT_NOFILE|Restoring FAILED|Dumping FAILED|failed with -1$)")
_NOISE = re.compile(
    r"(Unlock network|Running network-unlock|Unfreezing tasks|Restoring FS|Writing stats|"
    r"Dumping finished|Restore finished|Tasks resumed|Unseizing|Killing|kill|Warn \()",
    re.I,
)


def _clean(line: str) -> str:
    line = _STAMP.sub("", line.rstrip())
    return _PID.sub("", line).strip()


def error_lines(log: str | Path, limit: int = 3) -> list[str]:
    """The first distinct ``Error (...)`` lines of a CRIU log (the cause comes first), at most `limit`.

    Benign errors (CRIU logs them and continues) and the generic "FAILED." lines are used only
    when nothing else was logged.
    """
    text = _read(log)
    errors: list[str] = []
    benign: list[str] = []
    for raw in text.splitlines():
        line = _clean(raw)
        m = _ERROR.search(line)
        if m:
            msg = f"{m.group(2)} ({m.group(1)})"
            bucket = benign if _BENIGN.search(m.group(2)) else errors
            if msg not in bucket:
                bucket.append(msg)
    return (errors or benign)[:limit]


def tail(log: str | Path, n: int = 3) -> list[str]:
    """The last `n` meaningful lines, for logs that failed without an ``Error (`` line."""
    lines = [_clean(x) for x in _read(log).splitlines()]
    lines = [x for x in lines if x and not _NOISE.search(x)]
    return lines[-n:]


def summarize(log: str | Path, limit: int = 3) -> str:
    """One line for ``ColdstartError``: the failing line(s) of the log joined with ``; ``."""
    lines = error_lines(log, limit) or tail(log, limit)
    return "; ".join(lines) if lines else "no error line in the CRIU log"


def _read(log: str | Path) -> str:
    if isinstance(log, Path) or ("\n" not in log and len(log) < 4096 and Path(log).exists()):
        try:
            return Path(log).read_text(errors="replace")
        except OSError:
            return ""
    return str(log)
