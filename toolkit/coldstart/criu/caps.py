"""Linux capabilities as CRIU sees them: what a process holds, and what a restore needs.

Why: in a container, CRIU restores with only the container's capabilities. It needs some for itself
(RESTORE_NEEDS) and gives every restored task back its dumped permitted set, which it can only do
with those capabilities in its own set. Checking both before starting CRIU turns an obscure CRIU
failure (or a restore that never finishes) into one line that names the missing capability.
"""
from __future__ import annotations

from pathlib import Path

# bit number -> name, as in <linux/capability.h>
NAMES = ("CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
         "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
         "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
         "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
         "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF",
         "CHECKPOINT_RESTORE")

# What our restore (CRIU in fresh PID/mount namespaces, the run-dir overlay, a private /dev/shm) needs in
# the restoring container, and why: measured by experiments/container_least_caps.py
# (results/containers-least-caps); docs/containers.md lists the same set.
RESTORE_NEEDS: dict[str, str] = {
    "SYS_ADMIN": "the restore's PID and mount namespaces, its mounts, CRIU's PID and seccomp restore",
    "NET_ADMIN": "CRIU's start-up probes create a veth pair and socket buffers are restored with SO_SNDBUFFORCE",
    "SYS_TIME": "CRIU restores the server's time namespace with its clock offsets",
    "SYS_CHROOT": "CRIU changes root into the restored mount namespace",
    "DAC_OVERRIDE": "the run-dir overlay: overlayfs makes its work dir with mode 000 and must still enter it",
}


def from_mask(mask: int) -> set[str]:
    return {name for bit, name in enumerate(NAMES) if mask >> bit & 1}


def of_pid(pid: int | str = "self", field: str = "CapEff") -> set[str]:
    """A capability set of a process (CapEff, CapPrm, CapBnd...) from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return from_mask(int(line.split()[1], 16))
    raise ValueError(f"no {field} in /proc/{pid}/status")


def held_by_tree(pids: list[int]) -> list[str]:
    """The union of the tasks' permitted sets: what a restore must be able to give back."""
    held: set[str] = set()
    for pid in pids:
        try:
            held |= of_pid(pid, "CapPrm")
        except (OSError, ValueError):
            continue
    return sorted(held, key=NAMES.index)


def missing_for_restore(server_caps: list[str] | None, have: set[str] | None = None) -> list[str]:
    """Capabilities this process lacks for restoring a tree dumped holding ``server_caps`` (None: not
    recorded, only CRIU's own needs are checked)."""
    have = of_pid() if have is None else have
    need = set(RESTORE_NEEDS) | set(server_caps or [])
    return sorted(need - have, key=lambda n: NAMES.index(n) if n in NAMES else len(NAMES))


def explain(missing: list[str]) -> str:
    why = [f"CAP_{n} ({RESTORE_NEEDS[n]})" if n in RESTORE_NEEDS else f"CAP_{n} (the dumped server held it)"
           for n in missing]
    return "this container lacks " + ", ".join(why) + ": see docs/containers.md"
