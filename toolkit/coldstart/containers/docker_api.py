"""docker's API (docker-py) for the containers stage, which alone talks to docker: connecting to the
daemon, the daemon's facts, networks and volumes, importing and building images. Creating, starting
and following containers is run.py's, through the client this module makes; nothing outside
coldstart.containers uses docker.

The daemon is ours (scripts/start-docker: its own data root and socket), found by
$COLDSTART_DOCKER_HOST, else $DOCKER_HOST, else the socket scripts/start-docker uses by default.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterable

from coldstart.errors import ColdstartError

DEFAULT_HOST = "unix:///var/lib/coldstart-docker/docker.sock"


def docker_host() -> str:
    return os.environ.get("COLDSTART_DOCKER_HOST") or os.environ.get("DOCKER_HOST") or DEFAULT_HOST


CLIENT_TIMEOUT_S = 900  # a call to the daemon (a container's wait, an image import) may take this long


def client(host: str | None = None):
    """A docker-py client that has answered a ping; one clear error line otherwise."""
    try:
        import docker
    except ImportError:
        raise ColdstartError("docker-py is not installed (pip install docker; scripts/setup does it)") from None
    host = host or docker_host()
    try:
        c = docker.DockerClient(base_url=host, timeout=CLIENT_TIMEOUT_S)
        c.ping()
    except Exception as e:  # noqa: BLE001 - docker-py raises several kinds for "no daemon"
        raise ColdstartError(f"dockerd is not reachable at {host} ({type(e).__name__}): "
                             "start one with scripts/start-docker") from None
    return c


@dataclass(frozen=True)
class DaemonFacts:
    version: str
    api_version: str
    experimental: bool
    seccomp: bool
    runtime: str  # the daemon's default OCI runtime
    runtimes: list[str]  # every OCI runtime the daemon knows

    @property
    def major(self) -> int:
        try:
            return int(self.version.split(".")[0])
        except ValueError:
            return 0

    @property
    def knows_checkpoint_restore_cap(self) -> bool:
        """Docker learnt the capability name CHECKPOINT_RESTORE in 23.0 (20.10 refuses it)."""
        return self.major >= 23


def daemon_facts(c) -> DaemonFacts:
    v = c.version()
    info = c.info()
    sec = " ".join(str(x) for x in info.get("SecurityOptions") or [])
    return DaemonFacts(version=str(v.get("Version", "")), api_version=str(v.get("ApiVersion", "")),
                       experimental=bool(v.get("Experimental", False) or info.get("ExperimentalBuild", False)),
                       seccomp="seccomp" in sec, runtime=str(info.get("DefaultRuntime", "")),
                       runtimes=sorted(info.get("Runtimes") or {}))


RUNTIME_ENV = "COLDSTART_OCI_RUNTIME"  # a runtime's name, or "default" for the daemon's own choice
_runtimes_seen: dict[str, str | None] = {}  # daemon -> the runtime chosen for it


def oci_runtime(c) -> str | None:
    """The OCI runtime every container of ours runs under (docker's ``--runtime``): $COLDSTART_OCI_RUNTIME
    when set, else the daemon's default (None). crun (scripts/start-docker registers it beside runc) shortens
    docker's start call by 0.015-0.03 s, but a restore's first token no measurably
    (results/spot-checks/oci-runtime): the daemon's choice stands unless asked. Asks the daemon once: it
    is called inside the timed create of a container."""
    key = str(c.api.base_url)
    if key in _runtimes_seen:
        return _runtimes_seen[key]
    asked = os.environ.get(RUNTIME_ENV, "").strip()
    chosen = None
    if asked and asked != "default":
        known = set(c.info().get("Runtimes") or {})
        if asked not in known:
            raise ColdstartError(f"${RUNTIME_ENV}={asked}: the daemon knows no such OCI runtime "
                                 f"(it knows: {', '.join(sorted(known)) or 'none'})")
        chosen = asked
    _runtimes_seen[key] = chosen
    return chosen


NETWORK = "coldstart"  # a user-defined bridge: each container its own network namespace, ports published
_networks_seen: set[tuple[str, str]] = set()  # (daemon, name): known to exist, not asked again


def ensure_network(c) -> str:
    """Our bridge network (created once; dockerd runs without the default bridge). Returns its name.
    Asks the daemon once per daemon and name: it is called inside the timed create of a container."""
    import docker

    name = NETWORK
    key = (str(c.api.base_url), name)
    if key in _networks_seen:
        return name
    if not any(n.name == name for n in c.networks.list(names=[name])):  # the filter matches substrings
        try:
            c.networks.create(name, driver="bridge", check_duplicate=True)
        except docker.errors.APIError as e:
            if "already exists" not in str(e):
                raise ColdstartError(f"cannot create docker network {name}: {e}") from None
    _networks_seen.add(key)
    return name


def image_id(c, tag: str) -> str | None:
    """The image's id, or None when the daemon has no image by that tag."""
    import docker

    try:
        return c.images.get(tag).id
    except docker.errors.ImageNotFound:
        return None


def remove_other_tags(c, repository: str, keep: str, keep_recent: int = 0) -> list[str]:
    """Remove every ``repository:*`` image but ``keep`` and the ``keep_recent`` most recently tagged
    others (each runtime image is a separate 7 GB import: old ones filled this machine's disk).
    Images a container still uses are left alone."""
    import docker

    gone = []
    others = [img for img in c.images.list(name=repository) if keep not in img.tags]
    others.sort(key=lambda img: (img.attrs.get("Metadata") or {}).get("LastTagTime") or "", reverse=True)
    for img in others[keep_recent:]:
        tags = [t for t in img.tags if t.split(":", 1)[0] == repository]
        if not tags:
            continue
        for t in tags:
            try:
                c.images.remove(t, noprune=False)
                gone.append(t)
            except docker.errors.APIError:
                pass
    return gone


def import_tar_stream(c, stream: IO[bytes], repository: str, tag: str, changes: Iterable[str] = ()) -> str:
    """``docker import`` of a root filesystem tar read from ``stream``; returns the image id."""
    import json

    out = c.api.import_image_from_stream(stream, repository=repository, tag=tag, changes=list(changes) or None)
    text = out if isinstance(out, str) else out.decode(errors="replace") if isinstance(out, bytes) else str(out)
    for line in reversed([x for x in text.splitlines() if x.strip()]):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if "error" in d:
            raise ColdstartError(f"docker import of {repository}:{tag} failed: {d['error']}")
    iid = image_id(c, f"{repository}:{tag}")
    if not iid:
        raise ColdstartError(f"docker import of {repository}:{tag} left no image ({text.strip()[-200:]})")
    return iid


def build(c, context: Path, tag: str, buildargs: dict[str, str] | None = None) -> str:
    """``docker build`` of a small context directory; returns the image id (errors name the failing step)."""
    import docker

    try:
        img, _logs = c.images.build(path=str(context), tag=tag, buildargs=buildargs or {}, rm=True, forcerm=True,
                                    network_mode="none")
    except docker.errors.BuildError as e:
        last = [x.get("stream", x.get("error", "")).strip() for x in e.build_log if isinstance(x, dict)]
        raise ColdstartError(f"docker build of {tag} failed: {e.msg} ({' | '.join(s for s in last[-3:] if s)})") from None
    return img.id


def run(c, image: str, command: list[str] | None = None, *, timeout: float = 600, **kw: Any) -> tuple[int, str]:
    """Run a container to completion and remove it; (exit code, output)."""
    kw.setdefault("runtime", oci_runtime(c))
    ctr = c.containers.run(image, command, detach=True, **kw)
    try:
        res = ctr.wait(timeout=timeout)
        logs = ctr.logs(stdout=True, stderr=True).decode(errors="replace")
        return int(res.get("StatusCode", -1)), logs
    finally:
        try:
            ctr.remove(force=True)
        except Exception:  # noqa: BLE001
            pass


def image_layers(c, image: str) -> list[Path]:
    """The image's layer directories on this host, top layer first (overlay2's UpperDir, then its
    LowerDir list): how the host reads the files a container of it will read. [] for another
    storage driver or a daemon on another machine (the host then warms the snapshot alone)."""
    try:
        gd = c.images.get(image).attrs.get("GraphDriver") or {}
    except Exception:  # noqa: BLE001 - docker-py raises several kinds; no layers means no remap
        return []
    if gd.get("Name") != "overlay2":
        return []
    data = gd.get("Data") or {}
    dirs = [data.get("UpperDir", "")] + (data.get("LowerDir") or "").split(":")
    return [Path(d) for d in dirs if d and Path(d).is_dir()]


def layer_remap(layers: list[Path]):
    """A function from a path inside a container of the image to the layer file that provides it
    (the top-most layer holding it as a regular file). A path no layer holds so (a volume, a
    symlink) maps to a path that does not exist: the warmer skips it rather than read the host's
    own file of that name. One lstat per layer tried, on strings: the host warmer maps ~900 paths
    this way while docker starts the container, on the same two cores."""
    roots = [str(d) for d in layers]
    cache: dict[Path, Path] = {}

    def remap(p: Path) -> Path:
        got = cache.get(p)
        if got is None:
            rel = str(p).lstrip("/")
            for root in roots:
                q = f"{root}/{rel}"
                try:
                    if stat.S_ISREG(os.lstat(q).st_mode):
                        got = Path(q)
                        break
                except OSError:
                    continue
            else:
                got = Path("/nonexistent-in-image-layers") / rel
            cache[p] = got
        return got

    return remap


def volume_path(c, name: str) -> Path | None:
    """Where this host sees the data of docker volume ``name``: the local driver's directory, for a
    volume with no mount options (an NFS or other device volume is mounted only while a container
    uses it), when it exists here. None for another driver, a daemon on another machine, or no such
    volume (``volume_exists`` tells those apart)."""
    import docker

    try:
        attrs = c.volumes.get(name).attrs
    except (docker.errors.NotFound, docker.errors.APIError):
        return None
    mp = Path(attrs.get("Mountpoint") or "/nonexistent")
    if attrs.get("Driver") != "local" or attrs.get("Options") or not mp.is_dir():
        return None
    return mp


def volume_exists(c, name: str) -> bool:
    import docker

    try:
        c.volumes.get(name)
        return True
    except docker.errors.NotFound:
        return False
