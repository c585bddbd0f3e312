"""Registry stage: snapshots (and other read-mostly trees) as OCI artifacts in a registry."""
