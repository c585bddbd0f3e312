"""The one-line error extracted from a CRIU log (no criu needed)."""
from coldstart.criu import logs

LOG = """(00.000000) Version: 4.2.1 (gitid 0)
(00.000100) Running on host Linux 6.18
(00.010000) Warn  (criu/kerndat.c:1300): Can't keep kdat cache on non-tempfs
(00.010001) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted
(00.020000) Error (criu/pagemap.c:171): Unable to open pagemap image: No such file or directory
(00.020001) Error (criu/mem.c:1368): Can't open pagemap
  12345: Error (criu/pie/restorer.c:1801): Unable to read pages
(00.030000) Error (criu/cr-restore.c:2605): Restoring FAILED.
"""


def test_first_and_last_error_lines(tmp_path):
    p = tmp_path / "restore.log"
    p.write_text(LOG)
    assert logs.error_lines(p, limit=2) == [
        "Unable to open pagemap image: No such file or directory (criu/pagemap.c:171)",
        "Can't open pagemap (criu/mem.c:1368)",
    ]
    assert logs.error_lines(p)[-1] == "Unable to read pages (criu/pie/restorer.c:1801)"
    s = logs.summarize(p)
    assert "\n" not in s and s.startswith("Unable to open pagemap image")


def test_tail_when_no_error_line(tmp_path):
    p = tmp_path / "x.log"
    p.write_text("(00.1) Dumping finished successfully\n(00.2) something odd happened\n")
    assert logs.summarize(p) == "something odd happened"


def test_benign_errors_only_when_nothing_else(tmp_path):
    p = tmp_path / "x.log"
    p.write_text("(00.1) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: EPERM\n"
                 "(00.2) Error (criu/cr-dump.c:1975): Dumping FAILED.\n")
    assert logs.summarize(p).startswith("rlimit: Can't setup RLIMIT_NOFILE")
