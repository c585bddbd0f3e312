"""Containers stage: the runtime image, checkpoint and restore containers, driven by docker-py
(docs/containers.md). ``docker_api`` is the one module that talks to docker."""
