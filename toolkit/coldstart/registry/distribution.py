"""The OCI distribution API, spoken directly (the one owner of the registry's HTTP protocol).

Why not a client library: the PyPI ``oras`` client reads whole blobs into memory and has no range
GETs, and a snapshot's data is gigabytes read by ranges. Only what we use is here: blob HEAD, upload
(POST then PUT, or PATCH pieces when streaming), cross-repo mount, GET (whole, one range, streamed),
manifests by tag or digest. Every request has a bounded timeout; a 401 is answered once by the auth
scheme the registry names (Basic, or a Bearer token fetched from its realm and refreshed on the next
401), so nothing hangs and a bad credential is one clear line.
"""
from __future__ import annotations

import base64
import hashlib
import os
import re
from dataclasses import dataclass, replace
from typing import Iterable, Iterator

import requests

from coldstart.errors import ColdstartError
from coldstart.netutil import is_loopback

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
TIMEOUT = (5.0, 60.0)  # (connect, read) seconds for every request; nothing waits longer
_REF = re.compile(r"^(?:(?P<scheme>https?)://)?(?P<host>[^/]+)/(?P<repo>[a-z0-9]+(?:[._/-][a-z0-9]+)*)"
                  r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")


class RegistryError(ColdstartError):
    """The registry refused, failed or could not be reached (names the request and the reason)."""


@dataclass(frozen=True)
class Ref:
    """``[http[s]://]host[:port]/repo[:tag][@sha256:...]``. Loopback hosts speak plain HTTP unless an
    https:// scheme is given (like docker's insecure-by-default localhost); others use HTTPS unless
    COLDSTART_REGISTRY_PLAIN_HTTP=1. HTTPS certificates are checked (``ca_bundle``)."""
    host: str
    repo: str
    tag: str | None
    digest: str | None
    scheme: str

    @classmethod
    def parse(cls, text: str) -> "Ref":
        m = _REF.match(text.strip())
        if not m:
            raise RegistryError(f"{text!r} is not a registry reference (host[:port]/repo[:tag][@sha256:...])")
        host = m["host"]
        scheme = m["scheme"] or ("http" if is_loopback(host) or os.environ.get("COLDSTART_REGISTRY_PLAIN_HTTP") == "1"
                                 else "https")
        return cls(host, m["repo"], m["tag"], m["digest"], scheme)

    @property
    def reference(self) -> str:
        """What to ask the manifests endpoint for: the digest if pinned, else the tag (default latest)."""
        return self.digest or self.tag or "latest"

    @property
    def base(self) -> str:
        return f"{self.scheme}://{self.host}/v2/{self.repo}"

    def __str__(self) -> str:
        return f"{self.host}/{self.repo}" + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


def ca_bundle() -> str | bool:
    """What HTTPS registries are checked against: $COLDSTART_REGISTRY_CA (a PEM file: a private
    registry's own CA), else the default trust store."""
    return os.environ.get("COLDSTART_REGISTRY_CA") or True


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Registry:
    """One repository of one registry; a ``requests.Session`` (keep-alive) per instance: give each
    thread its own (``clone``)."""

    def __init__(self, ref: Ref, *, username: str | None = None, password: str | None = None,
                 timeout: tuple[float, float] = TIMEOUT):
        self.ref = ref
        self.timeout = timeout
        self.username = username if username is not None else os.environ.get("COLDSTART_REGISTRY_USER")
        self.password = password if password is not None else os.environ.get("COLDSTART_REGISTRY_PASSWORD")
        self.s = requests.Session()
        self.verify = ca_bundle()  # per request: a session's own is overridden by $REQUESTS_CA_BUNDLE
        self._auth: str | None = None  # the Authorization header that last worked

    def clone(self) -> "Registry":
        r = Registry(self.ref, username=self.username, password=self.password, timeout=self.timeout)
        r._auth = self._auth
        return r

    # --- transport ----------------------------------------------------------------------------------

    def _request(self, method: str, url: str, *, ok: Iterable[int], what: str, stream: bool = False,
                 headers: dict | None = None, **kw) -> requests.Response:
        if url.startswith("/"):
            url = f"{self.ref.scheme}://{self.ref.host}{url}"
        for attempt in (0, 1):
            h = dict(headers or {})
            if self._auth:
                h["Authorization"] = self._auth
            try:
                r = self.s.request(method, url, headers=h, timeout=self.timeout, stream=stream,
                                   allow_redirects=True, verify=self.verify, **kw)
            except requests.RequestException as e:
                raise RegistryError(f"{what}: registry {self.ref.host} unreachable or too slow "
                                    f"({type(e).__name__}: {_short(e)})") from None
            if r.status_code == 401 and attempt == 0:
                self._authenticate(r, what)
                if kw.get("data") is not None and not isinstance(kw["data"], (bytes, str)):
                    raise RegistryError(f"{what}: the registry asked for credentials mid-upload; retry")
                continue
            if r.status_code in ok:
                return r
            raise RegistryError(f"{what}: {self.ref.host} answered {r.status_code} {_body(r)}")
        raise RegistryError(f"{what}: {self.ref.host} refused the credentials (401): set "
                            "COLDSTART_REGISTRY_USER and COLDSTART_REGISTRY_PASSWORD")

    def _authenticate(self, r: requests.Response, what: str) -> None:
        """Answer a 401 with the scheme in WWW-Authenticate: Basic, or a Bearer token from the realm."""
        challenge = r.headers.get("WWW-Authenticate", "")
        scheme, _, params = challenge.partition(" ")
        creds = (self.username or "", self.password or "")
        if scheme.lower() == "basic":
            if not self.username:
                raise RegistryError(f"{what}: {self.ref.host} needs credentials: set COLDSTART_REGISTRY_USER "
                                    "and COLDSTART_REGISTRY_PASSWORD")
            self._auth = "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
            return
        if scheme.lower() != "bearer":
            raise RegistryError(f"{what}: {self.ref.host} asks for unknown authentication {challenge!r}")
        p = dict(re.findall(r'(\w+)="([^"]*)"', params))
        if "realm" not in p:
            raise RegistryError(f"{what}: {self.ref.host}'s Bearer challenge has no realm")
        q = {k: p[k] for k in ("service", "scope") if k in p}
        if "scope" not in q:
            q["scope"] = f"repository:{self.ref.repo}:pull,push"
        try:
            t = requests.get(p["realm"], params=q, timeout=self.timeout, verify=self.verify,
                             auth=creds if self.username else None)
        except requests.RequestException as e:
            raise RegistryError(f"{what}: token service {p['realm']} unreachable ({type(e).__name__})") from None
        if t.status_code != 200:
            raise RegistryError(f"{what}: token service {p['realm']} answered {t.status_code} {_body(t)}")
        try:
            body = t.json()
        except ValueError:  # a proxy's or a portal's HTML page, say
            body = None
        token = (body.get("token") or body.get("access_token")) if isinstance(body, dict) else None
        if not token:
            raise RegistryError(f"{what}: token service {p['realm']} returned no token")
        self._auth = f"Bearer {token}"

    # --- blobs --------------------------------------------------------------------------------------

    def has_blob(self, digest: str) -> bool:
        r = self._request("HEAD", f"{self.ref.base}/blobs/{digest}", ok=(200, 404), what=f"HEAD blob {digest[:19]}")
        return r.status_code == 200

    def mount_blob(self, digest: str, from_repo: str) -> bool:
        """Cross-repository mount: no bytes move. False if the registry started an upload instead."""
        r = self._request("POST", f"{self.ref.base}/blobs/uploads/", params={"mount": digest, "from": from_repo},
                          ok=(201, 202), what=f"mount blob {digest[:19]}")
        if r.status_code == 202:  # not mountable: cancel the upload it opened
            loc = r.headers.get("Location")
            if loc:
                try:
                    self._request("DELETE", loc, ok=(204, 404, 405), what="cancel upload")
                except RegistryError:
                    pass
            return False
        return True

    def push_blob(self, data: bytes | Iterator[bytes], digest: str, size: int) -> None:
        """Upload a blob: one POST then one PUT carrying the body (bytes or an iterator of pieces,
        streamed with chunked transfer encoding). The registry checks the digest."""
        r = self._request("POST", f"{self.ref.base}/blobs/uploads/", ok=(202,), what=f"start upload {digest[:19]}")
        loc = r.headers.get("Location")
        if not loc:
            raise RegistryError(f"start upload {digest[:19]}: {self.ref.host} gave no upload location")
        sep = "&" if "?" in loc else "?"
        headers = {"Content-Type": "application/octet-stream"}
        if isinstance(data, bytes):
            headers["Content-Length"] = str(size)
        self._request("PUT", f"{loc}{sep}digest={digest}", ok=(201,), what=f"upload blob {digest[:19]}",
                      data=data, headers=headers)

    def get_blob(self, digest: str) -> bytes:
        return self._request("GET", f"{self.ref.base}/blobs/{digest}", ok=(200,), what=f"GET blob {digest[:19]}").content

    def stream_blob(self, digest: str, start: int = 0, end: int | None = None,
                    piece: int = 1 << 20) -> Iterator[bytes]:
        """The blob's bytes [start, end) as pieces, by one (range) GET."""
        headers = {}
        if start or end is not None:
            headers["Range"] = f"bytes={start}-" + ("" if end is None else str(end - 1))
        r = self._request("GET", f"{self.ref.base}/blobs/{digest}", ok=(200, 206), what=f"GET blob {digest[:19]}",
                          stream=True, headers=headers)
        if headers and r.status_code != 206:
            r.close()
            raise RegistryError(f"GET blob {digest[:19]}: {self.ref.host} ignored the Range header")
        try:
            yield from r.iter_content(piece)
        except requests.RequestException as e:
            raise RegistryError(f"GET blob {digest[:19]}: the transfer from {self.ref.host} broke "
                                f"({type(e).__name__}: {_short(e)})") from None
        finally:
            r.close()

    # --- manifests ----------------------------------------------------------------------------------

    def tags(self) -> list[str]:
        """The repository's tags (none when the repository does not exist yet)."""
        r = self._request("GET", f"{self.ref.base}/tags/list", ok=(200, 404), what="list tags")
        if r.status_code == 404:
            return []
        try:
            return [str(t) for t in (r.json().get("tags") or [])]
        except (ValueError, AttributeError):
            raise RegistryError(f"list tags: {self.ref.host} answered something that is not a tag list") from None

    def at(self, tag: str) -> "Registry":
        """The same repository and credentials, at another tag."""
        r = self.clone()
        r.ref = replace(self.ref, tag=tag, digest=None)
        return r

    def put_manifest(self, body: bytes, media_type: str = OCI_MANIFEST, reference: str | None = None) -> str:
        ref = reference or self.ref.tag or "latest"
        r = self._request("PUT", f"{self.ref.base}/manifests/{ref}", ok=(201,), what=f"PUT manifest {ref}",
                          data=body, headers={"Content-Type": media_type})
        return r.headers.get("Docker-Content-Digest") or sha256_digest(body)

    def get_manifest(self, reference: str | None = None) -> tuple[bytes, str]:
        """The manifest's bytes and its digest (checked against the reference when it is a digest)."""
        ref = reference or self.ref.reference
        r = self._request("GET", f"{self.ref.base}/manifests/{ref}", ok=(200, 404), what=f"GET manifest {ref}",
                          headers={"Accept": OCI_MANIFEST})
        if r.status_code == 404:
            raise RegistryError(f"{self.ref.host}/{self.ref.repo}: no manifest {ref!r} (was it pushed?)")
        digest = sha256_digest(r.content)
        if ref.startswith("sha256:") and digest != ref:
            raise RegistryError(f"manifest {ref[:19]}: the registry returned bytes with digest {digest[:19]}")
        return r.content, digest


def _short(e: Exception) -> str:
    """The cause of a transport error in a few words: urllib3 nests it ("Connection refused", "Read
    timed out") inside the pool's and the URL's names."""
    s = str(e)
    m = re.search(r"\[Errno -?\d+\] ([^'\"()\]]+)", s) or re.search(r"((?:Read|Connect) timed out)", s)
    if m:
        return m.group(1).strip()
    return s.splitlines()[0][:160] if s else ""


def _body(r: requests.Response) -> str:
    try:
        return (r.text or "").strip().replace("\n", " ")[:200]
    except Exception:  # noqa: BLE001 - only for the message
        return ""
