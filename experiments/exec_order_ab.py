"""containers.run.exec_order against the profile's recorded order for the host's early reader:
experiments/container_restore_variants.py with one more variant key, "recorded_order": true (the
entrypoint's own files read in the profile's order, as before exec_order).

    PYTHONPATH=toolkit .venv/bin/python experiments/exec_order_ab.py IMAGE SIZES REPS OUT.jsonl VARIANTS [keep-memory]"""
import runpy
import sys
from pathlib import Path

from coldstart.containers import run

ordered = run.exec_order
init = run.HostWarm.__init__


def patched_init(self, *a, recorded_order: bool = False, **kw):
    # one start at a time: the early reader of this start looks exec_order up after this
    run.exec_order = (lambda files: list(files)) if recorded_order else ordered
    init(self, *a, **kw)


run.HostWarm.__init__ = patched_init
sys.argv = [str(Path(__file__).with_name("container_restore_variants.py")), *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
