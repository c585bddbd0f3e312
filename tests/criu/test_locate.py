"""coldstart.criu.locate: which criu binary, and what it can do (owned by h3, with the build)."""
from __future__ import annotations

import pytest

from coldstart.criu import locate
from coldstart.errors import ColdstartError


def test_both_builds_are_criu_4_2_1_and_only_patched_maps(criu_paths):
    for variant, path in criu_paths.items():
        assert locate.criu_version(path) == "4.2.1"
        assert locate.criu_supports_mmap(path) == (variant == "patched")
        info = locate.build_info(path)
        assert info["variant"] == variant
        assert info["tarball_sha256"] == "29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9"
    assert "patch" in locate.build_info(criu_paths["patched"])


def test_env_override_and_errors(monkeypatch, tmp_path, criu_paths):
    monkeypatch.setenv("COLDSTART_CRIU", str(criu_paths["stock"]))
    assert locate.find_criu("patched") == criu_paths["stock"]
    monkeypatch.setenv("COLDSTART_CRIU", str(tmp_path / "nope"))
    with pytest.raises(ColdstartError, match="COLDSTART_CRIU"):
        locate.find_criu()
    monkeypatch.delenv("COLDSTART_CRIU")
    monkeypatch.setenv("COLDSTART_CACHE", str(tmp_path))
    with pytest.raises(ColdstartError, match="criu not found: run make setup"):
        locate.find_criu()
    with pytest.raises(ColdstartError, match="unknown criu variant"):
        locate.find_criu("other")
