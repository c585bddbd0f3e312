"""Engine pieces that need no server: spec → argv/env, the io_uring filter, page release, the plugin's
switches and flat-dir lookup, the GPU tool finder (no device needed)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coldstart.engine.launcher import GPU_WORKER, SLEEP_WORKER, EngineSpec
from coldstart.errors import ColdstartError


def test_cpu_spec_argv_and_env(tmp_path):
    spec = EngineSpec(model=tmp_path / "m", run_dir=tmp_path / "r", port=8123)
    argv = spec.argv()
    assert argv[1:4] == ["-m", "coldstart.engine.noiouring", "--"]
    assert "vllm.entrypoints.openai.api_server" in argv
    for flag in ("--enforce-eager", "--enable-sleep-mode", "--kv-cache-memory-bytes"):
        assert flag in argv
    assert argv[argv.index("--worker-cls") + 1] == SLEEP_WORKER
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    env = spec.env_overrides()
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["COLDSTART_CPU_SLEEP"] == "1"
    for key in ("VLLM_CACHE_ROOT", "VLLM_RPC_BASE_PATH", "TMPDIR"):
        assert env[key].startswith(str(tmp_path / "r"))
    assert spec.full_env()["PATH"] == os.environ["PATH"]
    # our CPU worker runs in vLLM's in-process executor (which vLLM-CPU allows only without its
    # engine multiprocessing flag); the stock worker and the GPU keep vLLM's own default
    assert argv[argv.index("--distributed-executor-backend") + 1] == "uni"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    for other in (EngineSpec(model=tmp_path, run_dir=tmp_path, sleep_mode=False, worker_cls=""),
                  EngineSpec.for_gpu(tmp_path / "m", tmp_path / "r"),
                  EngineSpec(model=tmp_path, run_dir=tmp_path, extra_args=["--distributed-executor-backend", "mp"])):
        assert "uni" not in other.vllm_args() and "VLLM_ENABLE_V1_MULTIPROCESSING" not in other.env_overrides()


def test_compile_leftovers_are_only_unheld_precompiled_headers(tmp_path):
    spec = EngineSpec(model=tmp_path / "m", run_dir=tmp_path / "r")
    pch = tmp_path / "r" / "tmp" / "torchinductor_root" / "precompiled_headers"
    (pch / "locks").mkdir(parents=True)
    for name in ("a.h", "a.h.gch", "b.h", "b.h.gch"):
        (pch / name).write_bytes(b"x")
    (pch.parent / "7a").mkdir()
    (pch.parent / "7a" / "k.main.so").write_bytes(b"x")  # a compiled kernel: never a leftover
    assert spec.compile_leftovers() == [pch / "a.h.gch", pch / "b.h.gch"]
    # one the server held open stays (CRIU restores open files by path)
    assert spec.compile_leftovers(["tmp/torchinductor_root/precompiled_headers/b.h.gch"]) == [pch / "a.h.gch"]
    assert EngineSpec(model=tmp_path, run_dir=tmp_path / "none").compile_leftovers() == []


def test_gpu_spec_uses_vllm_sleep(tmp_path):
    spec = EngineSpec.for_gpu(tmp_path / "m", tmp_path / "r")
    args = spec.vllm_args()
    assert "--enable-sleep-mode" in args and args[args.index("--worker-cls") + 1] == GPU_WORKER
    assert "--enforce-eager" not in args and "--kv-cache-memory-bytes" not in args
    assert "COLDSTART_CPU_SLEEP" not in spec.env_overrides()


def test_spec_rejects_cpu_sleep_without_our_worker(tmp_path):
    with pytest.raises(ColdstartError, match="worker"):
        EngineSpec(model=tmp_path, run_dir=tmp_path, worker_cls="")
    with pytest.raises(ColdstartError, match="device"):
        EngineSpec(model=tmp_path, run_dir=tmp_path, device="tpu")
    stock = EngineSpec(model=tmp_path, run_dir=tmp_path, sleep_mode=False, worker_cls="")
    assert "--worker-cls" not in stock.vllm_args() and "--enable-sleep-mode" not in stock.vllm_args()


def test_noiouring_filter_blocks_only_io_uring():
    code = ("from coldstart.engine import noiouring as n; import os; "
            "print(n.io_uring_blocked(), os.getpid() > 0)")
    out = subprocess.run([sys.executable, "-m", "coldstart.engine.noiouring", "--", sys.executable, "-c", code],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True"]


def test_release_keeps_address_and_frees_pages():
    import torch

    from coldstart.engine.sleep_worker import release_tensors, rss_bytes

    t = torch.ones(64 << 18, dtype=torch.float32)  # 64 MiB, touched
    ptr = t.data_ptr()
    before = rss_bytes()
    total, released = release_tensors([t, t[10:]])  # the same storage counts once
    assert total == 64 << 20 and released >= total - 2 * 4096
    assert before - rss_bytes() >= 60 << 20
    assert t.data_ptr() == ptr and float(t[1 << 20:-(1 << 20)].abs().sum()) == 0.0
    t.fill_(2.0)  # still usable at the same address
    assert float(t[-1]) == 2.0


def test_find_flat_dir_order(tmp_path, monkeypatch):
    from coldstart.engine.plugin import find_flat_dir

    def mk(d: Path) -> Path:
        d.mkdir(parents=True)
        (d / "weights.flat").write_bytes(b"")
        (d / "weights.index.json").write_text("{}")
        return d

    model = tmp_path / "model"
    inside = mk(model / "coldstart-flat")
    monkeypatch.delenv("COLDSTART_FLAT_DIR", raising=False)
    assert find_flat_dir(model) == inside
    env = mk(tmp_path / "env")
    monkeypatch.setenv("COLDSTART_FLAT_DIR", str(env))
    assert find_flat_dir(model) == env
    extra = mk(tmp_path / "extra")
    assert find_flat_dir(model, {"flat_dir": str(extra)}) == extra
    monkeypatch.delenv("COLDSTART_FLAT_DIR")
    with pytest.raises(ColdstartError, match="no flat weights"):
        find_flat_dir(tmp_path / "nothing")


def test_plugin_enables_cpu_sleep_only_when_asked():
    code = ("import os; from vllm.platforms.cpu import CpuPlatform; import coldstart.engine.plugin as p; "
            "p.register(); before = CpuPlatform().is_sleep_mode_available(); "
            "os.environ['COLDSTART_CPU_SLEEP'] = '1'; p._registered = False; p.register(); "
            "from vllm.model_executor.model_loader import get_model_loader; "
            "from vllm.config.load import LoadConfig; "
            "print(before, CpuPlatform().is_sleep_mode_available(), "
            "type(get_model_loader(LoadConfig(load_format='coldstart'))).__name__)")
    env = {k: v for k, v in os.environ.items() if k != "COLDSTART_CPU_SLEEP"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split()[-3:] == ["False", "True", "ColdstartModelLoader"], out.stderr[-2000:]


def test_gpu_tools_found_or_named(tmp_path, monkeypatch):
    from coldstart.engine.gpu import GpuCheckpointTools, gpu_facts

    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("CRIU_CUDA_PLUGIN_DIR", raising=False)
    missing = GpuCheckpointTools.find(plugin_dir=tmp_path / "none", state_dir=tmp_path / "state")
    assert not missing.ok and len(missing.problems) == 2 and missing.criu_args() == []
    assert "checkpoint API is unusable: libcuda.so.1 cannot be loaded" in missing.problems[0]
    assert not (tmp_path / "state").exists()  # no command of ours written where it cannot work
    (tmp_path / "bin").mkdir()
    cc = tmp_path / "bin" / "cuda-checkpoint"
    cc.write_text("#!/bin/sh\n")
    cc.chmod(0o755)
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "cuda_plugin.so").write_bytes(b"")
    found = GpuCheckpointTools.find(plugin_dir=tmp_path / "plugins")
    assert found.ok and found.criu_args() == ["-L", str(tmp_path / "plugins")]
    assert found.criu_env({"PATH": "/usr/bin"})["PATH"].startswith(str(tmp_path / "bin"))
    assert gpu_facts() == {}  # no nvidia-smi on PATH


def test_our_cuda_checkpoint_command(tmp_path):
    """The ``cuda-checkpoint`` that GpuCheckpointTools falls back to: runs our module from any cwd,
    rewritten only when it changes (the GPU side runs on the H100 kit: tests/gpu, docs/gpu.md)."""
    from coldstart.engine.cuda_checkpoint import command_dir

    d = command_dir(tmp_path / "state")
    cc = d / "cuda-checkpoint"
    assert d == tmp_path / "state" / "bin" and os.access(cc, os.X_OK)
    mtime = cc.stat().st_mtime_ns
    assert command_dir(tmp_path / "state") == d and cc.stat().st_mtime_ns == mtime
    out = subprocess.run([str(cc), "-h"], capture_output=True, text=True, cwd="/", env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and "--action" in out.stdout and "--get-restore-tid" in out.stdout


def test_pidns_lookups_inside_a_pid_namespace():
    """In our PID namespace /proc is the host's: vLLM's /proc/<getpid()> lookups must be redirected."""
    code = "\n".join([
        "import os, subprocess, sys, time",
        "from coldstart.engine import pidns",
        "assert pidns.proc_is_foreign() and os.getpid() == 1",
        "assert pidns.host_pid_of(1) == int(os.readlink('/proc/self'))",
        "assert pidns.install()",
        "from vllm.utils import cpu_resource_utils as c",
        "assert c.get_memory_affinity() == pidns.get_memory_affinity() != []",
        "p = subprocess.Popen([sys.executable, '-c', 'import subprocess, time; "
        "subprocess.Popen([\"sleep\", \"60\"]); time.sleep(60)'])",
        "time.sleep(1)",
        "host = pidns.host_pid_of(p.pid)",
        "assert host and host != p.pid",
        "import vllm.v1.utils as vu",
        "vu.kill_process_tree(p.pid)",
        "assert p.wait(10) == -9",
        "print('ok')",
    ])
    out = subprocess.run(["unshare", "--pid", "--fork", "setsid", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().endswith("ok"), out.stderr[-3000:]
    from coldstart.engine import pidns

    assert not pidns.proc_is_foreign() and not pidns.install()  # outside: nothing patched


def test_startup_failure_names_the_root_cause():
    from coldstart.engine.launcher import _last_error_line

    log = "\n".join([
        "(APIServer pid=1) WARNING [x.py:1] failed to increase ulimit: `OSError: [Errno 24] Too many open files`",
        "(VllmWorker-0 pid=41) ERROR 11-22 11:17:50 [multiproc_executor.py:953] FileNotFoundError: [Errno 2] x",
        "(EngineCore pid=26) ERROR [core.py:1510] Exception: WorkerProc initialization failed ... root cause.",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    ])
    assert _last_error_line(log) == "FileNotFoundError: [Errno 2] x"
