"""Where a snapshot's access profiles are: the one it ships (``profile.json`` beside its manifest)
and the one this node recorded for it (in the node's state dir, by snapshot id), and which of them a
warm follows.

Kept free of numpy and of the warmers: a container restore warmed from its host asks only these
questions before its first token, and importing the warm stage itself (numpy) there cost CRIU's
phase ~0.14 CPU-s on 2 cores and held back the imports the restore makes beside it
(results/spot-checks/defer-warm-import).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from coldstart.state import profiles_dir

PROFILE_NAME = "profile.json"


def snapshot_root(paths: list[Path] | list[str]) -> Path | None:
    """The snapshot directory the paths belong to: the nearest ancestor with a manifest.json."""
    for p in map(Path, paths):
        p = p.absolute()
        for d in [p, *p.parents] if p.is_dir() else p.parents:
            if (d / "manifest.json").is_file():
                return d
    return None


def snapshot_id(root: Path) -> str:
    """Identity of a snapshot for its profile: the manifest's model digest and creation time."""
    try:
        m = json.loads((Path(root) / "manifest.json").read_text())
        return f"{str(m.get('model_digest', ''))[:16]}@{m.get('created_at', '')}"
    except (OSError, ValueError, AttributeError):
        return ""


def resolve_profile(root: Path | None) -> Path | None:
    """The profile to follow under the COLDSTART_WARM_PROFILE policy."""
    pol = os.environ.get("COLDSTART_WARM_PROFILE", "auto")
    if pol == "off":
        return None
    if pol not in ("auto", ""):
        return Path(pol)
    node = node_profile(root) if root is not None else None
    if node is not None and node.is_file():
        return node
    return root / PROFILE_NAME if root is not None and (root / PROFILE_NAME).is_file() else None


def node_profile(root: Path) -> Path | None:
    """Where this node keeps the profile it recorded for the snapshot at ``root`` (by snapshot id,
    so a moved or read-only copy finds it too); None when the snapshot has no id."""
    import xxhash

    sid = snapshot_id(root)
    return profiles_dir() / xxhash.xxh3_64(sid.encode()).hexdigest() / PROFILE_NAME if sid else None


def should_record(root: Path | None, profile: Path | None) -> bool:
    pol = os.environ.get("COLDSTART_WARM_RECORD", "auto")
    node = node_profile(root) if root is not None else None
    if pol == "off" or node is None:
        return False
    return pol == "force" or profile is None or not node.is_file()


def node_lacks_profile(root: Path | None) -> bool:
    """Whether a restore of the snapshot at ``root`` should record this node's profile although it
    does not warm (COLDSTART_WARM_RECORD auto: while the node has none; force: always)."""
    return should_record(root, Path(PROFILE_NAME))
