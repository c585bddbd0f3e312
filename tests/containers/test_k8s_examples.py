"""The Kubernetes examples under docker/k8s/ cannot run here (no cluster), so they are held to the
settings the container tests use: the same capabilities, seccomp and mounts."""
from pathlib import Path

import yaml

from coldstart.containers import run

K8S = Path(__file__).resolve().parents[2] / "docker" / "k8s"


def _container(doc: dict) -> dict:
    spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Job" else doc["spec"]
    (ctr,) = spec["containers"]
    return ctr


def test_the_restore_pod_has_the_restore_containers_settings():
    ctr = _container(yaml.safe_load((K8S / "restore-pod.yaml").read_text()))
    sec = ctr["securityContext"]
    assert sec["capabilities"]["drop"] == ["ALL"]
    assert sorted(sec["capabilities"]["add"]) == run.RESTORE_CAPS
    assert sec["seccompProfile"]["type"] == "RuntimeDefault" and not sec["privileged"]
    mounts = {m["mountPath"]: m for m in ctr["volumeMounts"]}
    assert mounts["/snapshot"]["readOnly"] is True
    assert set(run.STATE_TMPFS) <= set(mounts)


def test_the_checkpoint_job_has_the_checkpoint_containers_settings():
    ctr = _container(yaml.safe_load((K8S / "checkpoint-job.yaml").read_text()))
    sec = ctr["securityContext"]
    assert sec["capabilities"]["drop"] == ["ALL"]
    assert sorted(sec["capabilities"]["add"]) == run.CHECKPOINT_CAPS  # the default layout, hot
    assert sec["seccompProfile"]["type"] == "Unconfined" and not sec["privileged"]
    assert ctr["command"] == ["coldstart"] and ctr["args"][0] == "checkpoint"
    assert ctr["args"][ctr["args"].index("--server-caps") + 1] == "none"
    assert ctr["args"][ctr["args"].index("--port") + 1] == str(run.CONTAINER_PORT)
    assert ctr["args"][ctr["args"].index("--listen") + 1] == "0.0.0.0"  # the pod's port reaches it, no relay
    mounts = {m["mountPath"]: m for m in ctr["volumeMounts"]}
    assert set(run.STATE_TMPFS) <= set(mounts)  # the recording restore's state
    assert {"name": "TMPDIR", "value": "/out"} in ctr["env"]
