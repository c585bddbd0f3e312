"""Node-local state shared by the stages: where a host keeps what it learns about snapshots
(verification records, recorded access profiles) and each restore's writable directory.

A snapshot itself is never written after publish; everything a restore produces lands here.
``COLDSTART_STATE_DIR`` overrides the default, which lives under /run (a tmpfs on most hosts and in
containers: cleared at boot, so a reboot re-verifies and re-records).
"""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Where `make setup` and the stages cache what they build or make once per machine (criu
    builds, the container image's inputs, tiny models, the FUSE daemon, benchmark files);
    ``COLDSTART_CACHE`` overrides."""
    return Path(os.environ.get("COLDSTART_CACHE", "/var/cache/coldstart"))


def state_dir() -> Path:
    return Path(os.environ.get("COLDSTART_STATE_DIR", "/run/coldstart"))


def node_dir() -> Path:
    """What one restore learns for every later one on the node: verification records and access
    profiles. The state dir itself unless ``COLDSTART_NODE_DIR`` names another: a container's state
    dir is its own tmpfs, so containers share the node's knowledge through a host directory mounted
    there (coldstart.containers.run), and the second replica on a node neither re-hashes the
    snapshot nor re-records its profile."""
    return Path(os.environ.get("COLDSTART_NODE_DIR") or state_dir())


def profiles_dir() -> Path:
    """Access profiles recorded on this node, one folder per snapshot id."""
    return node_dir() / "profiles"


def restores_dir() -> Path:
    """One writable directory per restore (its server's run dir overlay, CRIU's logs)."""
    return state_dir() / "restores"


def failed_dir() -> Path:
    """The logs of the restores that failed here, CRIU's and the restored server's (the latest few of
    each): a failed restore's own directory goes with it, and its error names the copy kept here."""
    return state_dir() / "failed"
