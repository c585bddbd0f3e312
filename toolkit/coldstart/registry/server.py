"""A real OCI registry (Debian's docker-registry 2.8) on a loopback address, for tests, benchmarks
and the demo: its own storage directory, no service of the package's. The one owner of that
program's command line and configuration. ``proxy`` makes it a pull-through cache of another
registry (how a rack- or zone-level cache tier is built from the same software)."""
from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from coldstart.errors import ColdstartError

BINARY = "docker-registry"


@dataclass
class RegistryServer:
    proc: subprocess.Popen
    host: str  # host:port
    root: Path  # storage
    log: Path
    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def blob_path(self, digest: str) -> Path:
        """Where the filesystem driver keeps a blob's bytes (tests corrupt them here)."""
        algo, hexd = digest.split(":", 1)
        return self.root / "docker/registry/v2/blobs" / algo / hexd[:2] / hexd / "data"


def _config(root: Path, addr: str, proxy: str | None, htpasswd: Path | None, tls=None, token=None) -> str:
    lines = ["version: 0.1", "log:", "  level: warn", "  accesslog:", "    disabled: true", "storage:",
             "  filesystem:", f"    rootdirectory: {root}", "  delete:", "    enabled: true",
             "  cache:", "    blobdescriptor: inmemory", "http:", f"  addr: {addr}", "  headers:",
             "    X-Content-Type-Options: [nosniff]"]
    if tls is not None:
        lines += ["  tls:", f"    certificate: {tls.cert}", f"    key: {tls.key}"]
    if proxy:
        lines += ["proxy:", f"  remoteurl: {proxy}"]
    if htpasswd:
        lines += ["auth:", "  htpasswd:", "    realm: coldstart", f"    path: {htpasswd}"]
    elif token is not None:
        from coldstart.registry.tokens import ISSUER, SERVICE

        lines += ["auth:", "  token:", f"    realm: {token.realm}", f"    service: {SERVICE}",
                  f"    issuer: {ISSUER}", f"    rootcertbundle: {token.keys.ca}"]
    return "\n".join(lines) + "\n"


def start(workdir: Path, port: int, *, host: str = "127.0.0.1", proxy: str | None = None,
          htpasswd: Path | None = None, timeout: float = 30.0, netns: str | None = None,
          tls=None, token=None) -> RegistryServer:
    """Start a registry serving ``workdir``/storage on ``host``:``port`` and wait until it answers
    /v2/. ``netns``: run it inside that network namespace (ip netns exec). ``tls``: a
    tokens.KeyPair to serve HTTPS with; ``token``: a running tokens.TokenService whose tokens the
    registry demands (Bearer scheme)."""
    if not shutil.which(BINARY):
        raise ColdstartError(f"{BINARY} not found (scripts/setup installs Debian's docker-registry)")
    workdir = Path(workdir)
    root = workdir / "storage"
    root.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "config.yml"
    cfg.write_text(_config(root, f"{host}:{port}", proxy, htpasswd, tls, token))
    log = workdir / "registry.log"
    argv = [BINARY, "serve", str(cfg)]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    with open(log, "ab") as lf:
        proc = subprocess.Popen(argv, stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    srv = RegistryServer(proc, f"{host}:{port}", root, log, "https" if tls is not None else "http")
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise ColdstartError(f"{BINARY} exited with {proc.returncode}: {log.read_text()[-300:].strip()}")
        if netns is None:
            try:
                if requests.get(f"{srv.url}/v2/", timeout=1,
                                verify=str(tls.ca) if tls is not None else True).status_code in (200, 401):
                    return srv
            except requests.RequestException:
                pass
        elif subprocess.run(["ip", "netns", "exec", netns, "curl", "-s", "-o", "/dev/null", f"{srv.url}/v2/"],
                            capture_output=True).returncode == 0:
            return srv
        time.sleep(0.1)
    srv.stop()
    raise ColdstartError(f"{BINARY} did not answer on {srv.host} within {timeout:.0f} s (log: {log})")
