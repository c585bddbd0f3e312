"""Containers stage: the runtime image, checkpoint and restore containers, driven by docker-py
(docs/containers.md). Nothing outside this stage talks to docker: ``docker_api`` connects and handles
images, networks and volumes, ``run`` creates and follows containers."""
