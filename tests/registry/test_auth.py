"""An authenticated registry as fleets run one: HTTPS with a private CA, and the Bearer token scheme
(a token service that hands out short-lived JWTs for Basic credentials). Push, pull and the lazy
mount all work through it; without credentials or without the CA each fails with one line naming
the problem; a mount whose token expires renews it and goes on serving."""
from __future__ import annotations

import os
import time

import pytest

from coldstart.engine.launcher import free_port
from coldstart.registry import artifact, mount, server, tokens
from coldstart.registry.distribution import RegistryError

from .test_push_pull import SMALL, same_tree

pytestmark = pytest.mark.timeout(600)

USER, PASSWORD = "fleet", "s3cret"


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """(registry, token service) on 127.0.0.1: HTTPS with its own CA, Bearer tokens."""
    work = tmp_path_factory.mktemp("secure-registry")
    keys = tokens.make_keypair(work)
    svc = tokens.TokenService(keys, {USER: PASSWORD}).start()
    srv = server.start(work, free_port(), tls=keys, token=svc)
    yield srv, svc
    srv.stop()
    svc.stop()


@pytest.fixture
def creds(secure, monkeypatch, tmp_path):
    _, svc = secure
    monkeypatch.setenv("COLDSTART_REGISTRY_CA", str(svc.keys.ca))
    monkeypatch.setenv("COLDSTART_REGISTRY_USER", USER)
    monkeypatch.setenv("COLDSTART_REGISTRY_PASSWORD", PASSWORD)
    monkeypatch.setenv("COLDSTART_LAZY_CACHE", str(tmp_path / "lazy-cache"))


def test_https_and_bearer_push_pull_mount(secure, creds, tree, tmp_path):
    srv, svc = secure
    ref = f"https://{srv.host}/t/auth:v1"
    issued = svc.issued
    artifact.push(tree, ref, **SMALL)
    assert svc.issued > issued  # the registry sent the client to the token service
    artifact.pull(ref, tmp_path / "pulled")
    same_tree(tree, tmp_path / "pulled")
    m = mount.mount(ref, tmp_path / "mnt", prefetch=False, timeout_s=5)
    try:
        same_tree(tree, m.mountpoint)
    finally:
        m.unmount()
    assert "renewed" not in m.log.read_text()  # one token served the whole mount


def test_missing_credentials_or_ca_are_named(secure, creds, tree, monkeypatch):
    srv, svc = secure
    ref = f"https://{srv.host}/t/auth:v1"
    artifact.push(tree, ref, **SMALL)
    monkeypatch.setenv("COLDSTART_REGISTRY_PASSWORD", "wrong")
    with pytest.raises(RegistryError, match="token service .* 401"):
        artifact.fetch_index(artifact_registry(ref))
    monkeypatch.setenv("COLDSTART_REGISTRY_PASSWORD", PASSWORD)
    monkeypatch.delenv("COLDSTART_REGISTRY_CA")
    with pytest.raises(RegistryError, match="SSLError|certificate"):
        artifact.fetch_index(artifact_registry(ref))


def artifact_registry(ref: str):
    from coldstart.registry.distribution import Ref, Registry

    return Registry(Ref.parse(ref))


def test_mount_renews_an_expired_token(secure, creds, tree, tmp_path):
    """Tokens that live a few seconds: a read after the mount's token expired gets a 401 from the
    registry; the daemon asks the token service again and the read returns the right bytes."""
    srv, svc = secure
    ref = f"https://{srv.host}/t/auth:v1"
    artifact.push(tree, ref, **SMALL)
    svc.ttl = 3
    try:
        m = mount.mount(ref, tmp_path / "mnt", prefetch=False, timeout_s=5)
        try:
            src = (tree / "big.bin").read_bytes()
            with open(m.mountpoint / "big.bin", "rb", buffering=0) as f:
                assert os.pread(f.fileno(), 4096, 0) == src[:4096]
                time.sleep(svc.ttl + 2)
                issued = svc.issued
                assert os.pread(f.fileno(), 4096, 3 << 20) == src[3 << 20:(3 << 20) + 4096]
            assert svc.issued > issued
            assert "credentials renewed" in m.log.read_text()
        finally:
            m.unmount()
    finally:
        svc.ttl = 300.0
