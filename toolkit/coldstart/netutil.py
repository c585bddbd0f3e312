"""Address helpers shared by the stages that decide by where a peer or a server is: the gate (a
client on loopback passes), checkpoint and restore (a server listening on loopback needs a relay in
a container) and the registry client (plain HTTP to a registry on this host). Standard library only:
the gate imports it inside vLLM's API server process."""
from __future__ import annotations


def is_loopback(host: str) -> bool:
    """``host`` (an address, "localhost", or a ``host:port`` / ``[v6]:port`` as a registry reference
    spells it) is this host's loopback."""
    if host.startswith("["):
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.startswith("127.") or host in ("::1", "localhost") or host.startswith("::ffff:127.")
