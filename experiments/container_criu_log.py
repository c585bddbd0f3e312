"""Where a cold container restore's CRIU phase goes: one restore container (bench model by default),
page cache dropped, with host warming ("hw") or without ("none"), CRIU at -v4; prints the
entrypoint's events, the absolute times of the files CRIU writes in its work dir (restore.log is
created when CRIU opens its log, last written when it ends) beside COLDSTART_T0, and saves CRIU's
log as ./container-criu-restore-MODE.log.

    .venv/bin/python experiments/container_criu_log.py hw [bench|tiny]
"""
import json, sys, time
from pathlib import Path
from coldstart.bench.containers import first_completion, summary, snapshot_in_container
from coldstart.bench.criu import drop_caches
from coldstart.containers import docker_api, image, run
from coldstart.engine.launcher import free_port
from coldstart.models.tiny import cached_model

c = docker_api.client(None)
img = image.app_image(c, Path('.').resolve(), say=print)
size = sys.argv[2] if len(sys.argv) > 2 else 'bench'
model, snap = snapshot_in_container(c, img.tag, size, Path('/var/tmp/coldstart-bench-container'))
layers = docker_api.image_layers(c, img.tag)
hw = sys.argv[1] == 'hw'
drop_caches()
port = free_port()
t0, wall0 = time.monotonic(), time.time()
warmer = run.host_warm(snap, layers) if hw else None
ctr = run.create_restore(c, img.tag, snap, model, port, env={"COLDSTART_T0": repr(wall0), "COLDSTART_CRIU_LOG_LEVEL": "4"}, host_warms=hw)
ctr.start()
if warmer: warmer.container_started()
t1 = first_completion(port, str(model), t0 + 300, ctr)
print('first', t1 - t0)
s = summary(ctr, time.monotonic() + 60)
print(json.dumps(s.get('events')))
print('t0', wall0)
print(ctr.exec_run(['sh', '-c', 'cd /run/coldstart/restores/*/criu && stat -c "%n %.9W %.9Y" restore.log restored.pid notify.sh stats-restore 2>&1; date +%s.%N']).output.decode())
r = ctr.exec_run(['sh', '-c', 'cat /run/coldstart/restores/*/criu/restore.log'])
Path(f'container-criu-restore-{sys.argv[1]}.log').write_bytes(r.output)
if warmer: warmer.wait(); print('ahead', warmer.ahead.result() if warmer.ahead else None)
ctr.remove(force=True)
