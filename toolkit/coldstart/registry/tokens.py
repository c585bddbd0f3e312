"""A registry token service (the Docker/OCI Bearer token scheme) on a loopback address, for tests and
demos of an authenticated registry: the registry (server.py, ``token_auth``) sends clients here with
a 401; they come back with Basic credentials and get a short-lived JWT that the registry checks
against the service's certificate. Short lifetimes are the point: a lazy mount serves for hours
and must renew its token when the registry refuses it again.

The one owner of ``openssl``'s command line in the package: the certificate (also the registry's
TLS certificate, for 127.0.0.1) and the RS256 signatures are made by it, so no JWT or crypto
library is a dependency of the package.
"""
from __future__ import annotations

import base64
import json
import secrets
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from coldstart.errors import ColdstartError

SERVICE = "coldstart-registry"
ISSUER = "coldstart-token-service"
# docker-registry 2.8 accepts a token up to 60 s past its exp (clock skew; measured here: valid 40 s
# after exp, refused 65 s after). The service dates exp back by it, so ``ttl`` is how long the
# registry really accepts a token: seconds, for tests of renewal, not minutes.
REGISTRY_LEEWAY_S = 60


@dataclass(frozen=True)
class KeyPair:
    cert: Path  # PEM: the registry's certificate, for 127.0.0.1 and localhost, signed by ``ca``
    key: Path  # PEM, RSA 2048
    ca: Path  # PEM: the private CA clients trust (COLDSTART_REGISTRY_CA); the token verification root

    def der_b64(self) -> str:
        """The certificate as the JWT header's x5c entry (standard base64 of its DER)."""
        body = "".join(ln for ln in self.cert.read_text().splitlines() if ln and not ln.startswith("-----"))
        return body


def _openssl(*args: str) -> None:
    r = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise ColdstartError(f"openssl {args[0]} failed: {r.stderr.strip()[-200:]}")


def make_keypair(workdir: Path, name: str = "registry") -> KeyPair:
    """A private CA and a certificate it signs for 127.0.0.1/localhost, with its key (openssl). Not
    one self-signed certificate: TLS clients (rustls) refuse a CA certificate as a server's."""
    workdir.mkdir(parents=True, exist_ok=True)
    ca, ca_key = workdir / f"{name}-ca.crt", workdir / f"{name}-ca.key"
    cert, key, csr, ext = (workdir / f"{name}.{x}" for x in ("crt", "key", "csr", "ext"))
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca), "-days", "2",
             "-subj", "/CN=coldstart test CA")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1")
    ext.write_text("basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
                   "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
             "-out", str(cert), "-days", "2", "-extfile", str(ext))
    return KeyPair(cert, key, ca)


def _b64url(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def sign_jwt(claims: dict, keys: KeyPair) -> str:
    """An RS256 JWT whose header carries the certificate (x5c): the registry checks its chain up to
    its rootcertbundle (the CA)."""
    head = _b64url(json.dumps({"typ": "JWT", "alg": "RS256", "x5c": [keys.der_b64()]}).encode())
    body = _b64url(json.dumps(claims).encode())
    r = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(keys.key)], input=f"{head}.{body}".encode(),
                       capture_output=True)
    if r.returncode != 0:
        raise ColdstartError(f"openssl could not sign: {r.stderr.decode(errors='replace').strip()[-200:]}")
    return f"{head}.{body}.{_b64url(r.stdout)}"


@dataclass
class TokenService:
    """Serves GET /token?service=..&scope=repository:NAME:ACTIONS to clients with Basic ``users``
    credentials; the registry accepts each token for ``ttl`` seconds. ``issued`` counts the tokens
    given out."""
    keys: KeyPair
    users: dict[str, str]
    ttl: float = 300.0
    port: int = 0
    issued: int = 0
    refused: int = 0
    _srv: ThreadingHTTPServer | None = field(default=None, repr=False)

    @property
    def realm(self) -> str:
        return f"http://127.0.0.1:{self.port}/token"

    def start(self) -> "TokenService":
        svc = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                u = urlparse(self.path)
                if u.path != "/token":
                    return self._send(404, {"error": "not found"})
                user = svc._user(self.headers.get("Authorization", ""))
                if user is None:
                    svc.refused += 1
                    return self._send(401, {"error": "bad credentials"})
                q = parse_qs(u.query)
                access = []
                for scope in q.get("scope", []):
                    kind, _, rest = scope.partition(":")
                    name, _, actions = rest.rpartition(":")
                    if kind == "repository" and name:
                        access.append({"type": "repository", "name": name,
                                       "actions": [a for a in actions.split(",") if a in ("pull", "push")]})
                now = int(time.time())
                claims = {"iss": ISSUER, "sub": user, "aud": q.get("service", [SERVICE])[0], "iat": now,
                          "nbf": now - 5, "exp": now + int(svc.ttl) - REGISTRY_LEEWAY_S, "jti": secrets.token_hex(8), "access": access}
                svc.issued += 1
                self._send(200, {"token": sign_jwt(claims, svc.keys), "expires_in": int(svc.ttl)})

            def _send(self, code: int, body: dict):
                raw = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self._srv = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._srv.server_address[1]
        threading.Thread(target=self._srv.serve_forever, name="token-service", daemon=True).start()
        return self

    def _user(self, header: str) -> str | None:
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, _, pw = base64.b64decode(value).decode().partition(":")
        except ValueError:
            return None
        return user if self.users.get(user) == pw else None

    def stop(self) -> None:
        if self._srv is not None:
            self._srv.shutdown()
            self._srv.server_close()
