"""Ports and addresses: pick free ports, name taken ones."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import resource
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path

from orch.errors import ConfigError, PortInUseError

log = logging.getLogger(__name__)

DEFAULT_MASTER_PORT = 50051
DEFAULT_RENDEZVOUS_PORT = 29500


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on ``host:port`` and we could bind it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # Like the servers that will bind it: a port held only by TIME_WAIT connections is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel just handed out as free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def choose_port(
    requested: int | None, default: int, *, what: str, option: str, host: str = "127.0.0.1"
) -> int:
    """Resolve a port option.

    ``None`` means "the default if it is free, else any free port"; ``0`` means any free
    port; any other number must be free, else :class:`PortInUseError` names it.
    """
    if requested is None:
        return default if port_is_free(default, host) else free_port(host)
    if requested == 0:
        return free_port(host)
    if not 0 < requested < 65536:
        raise ConfigError(f"{option}={requested} is not a port: use 1-65535, or 0 for any free one")
    if not port_is_free(requested, host):
        raise PortInUseError(requested, what, option)
    return requested


def address_towards(host: str, port: int) -> str:
    """This host's address on the route to ``host`` (what the master sees us as)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        # connect() on UDP sends nothing; it only asks the kernel for the outgoing route.
        s.connect((host, port))
        return str(s.getsockname()[0])
    return "127.0.0.1"


# A server's second listener for the processes of its own user on this machine: a unix socket
# in a folder only that user can open (0700). A stranger on the machine cannot even connect to
# it, so no number of connections they open to the TCP port reaches the run's own ranks.
UNIX_SCHEME = "unix:"


def is_unix(address: str) -> bool:
    """True for a ``unix:/path`` address (a server's private listener)."""
    return address.startswith(UNIX_SCHEME)


def check_address(address: str) -> None:
    """A master's address: ``HOST:PORT``, or ``unix:/absolute/path``; a clear error for anything else."""
    if is_unix(address):
        if not address[len(UNIX_SCHEME) :].startswith("/"):
            raise ConfigError(f"expected unix:/absolute/path for a local master address, got {address!r}")
        return
    split_address(address)


SOCKET_PREFIX = "orch-"
STALE_EMPTY_SECONDS = 600.0  # a folder with no socket yet is a server still starting, unless older
STALE_SOCKET_SECONDS = 60.0  # a socket that refuses connections is a server starting, unless older


def sweep_stale_sockets(folder: Path) -> list[Path]:
    """Remove the private socket folders that a killed server left behind (a kernel killed
    with its master, an agent killed with its host): this user's, whose socket no longer
    has a listener (connecting is refused at once). Returns the folders removed."""
    removed: list[Path] = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        if not entry.name.startswith(SOCKET_PREFIX):
            continue
        try:
            info = entry.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            contents = list(entry.iterdir())
            if not contents:
                stale = now - info.st_mtime > STALE_EMPTY_SECONDS
            elif len(contents) == 1 and stat.S_ISSOCK((sock := contents[0].lstat()).st_mode):
                # refused, and bound a while ago: a server starting binds, then listens, and
                # connecting between the two is refused too (another run's master, starting
                # at the same moment in this process or another, must keep its socket)
                stale = now - sock.st_mtime > STALE_SOCKET_SECONDS and not _listening(contents[0])
            else:
                stale = False  # not the shape of one of ours: left alone
        except OSError:
            continue
        if stale:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(str(path))
        except ConnectionRefusedError:
            return False
        except OSError:
            return True  # busy, or anything else: leave it
    return True


MAX_SOCKET_PATH = 107  # bytes in a unix socket's path (sun_path holds 108, with the final NUL)


def socket_parent(name: str) -> Path:
    """Where a private socket named ``name`` goes: the temp dir, or /tmp (then /var/tmp,
    /dev/shm) when the temp dir's path is too long for a socket's, or cannot be written."""
    for parent in dict.fromkeys((tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm")):
        # mkdtemp's folder: the prefix and 8 random characters
        fits = len(os.fsencode(os.path.join(parent, SOCKET_PREFIX + "x" * 8, name))) <= MAX_SOCKET_PATH
        if fits and os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK):
            return Path(parent)
    raise ConfigError(
        f"no folder for a private unix socket: the temp dir {tempfile.gettempdir()!r} makes its path "
        f"longer than a socket's {MAX_SOCKET_PATH} bytes, and /tmp, /var/tmp and /dev/shm cannot be "
        "written: set TMPDIR to a short folder you can write"
    )


class PrivateSocket:
    """A unix socket path in a fresh 0700 folder (short, under the temp dir: a socket's path
    may be at most 107 bytes, which a run dir deep in a project would pass; a temp dir too
    long for that is passed over for /tmp)."""

    def __init__(self, name: str) -> None:
        parent = socket_parent(name)
        sweep_stale_sockets(parent)
        self.folder = Path(tempfile.mkdtemp(prefix=SOCKET_PREFIX, dir=parent))  # mkdtemp makes it 0700
        self.path = self.folder / name

    @property
    def address(self) -> str:
        return f"{UNIX_SCHEME}{self.path}"

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def connection_cap() -> int:
    """How many connections a TCP listener accepts at once: what the open-file limit leaves
    after a margin for the process's own files (run dir, logs, checkpoints), at least 256.
    Past it a new connection is closed at once, and the server keeps serving the ones it has."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = 2**20 if soft == resource.RLIM_INFINITY else soft
    return max(256, min(limit - 1024, 65536))


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` -> ``("host", port)``, with a clear error for anything else."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"expected HOST:PORT for the master address, got {address!r}")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (parsed, so ``127.evil.example`` is not one)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_local_address(host: str) -> bool:
    """True when ``host`` is an address of this machine (a loopback one, or one we can bind)."""
    if is_loopback(host):
        return True
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((host.strip("[]"), 0))
    except OSError:
        return False
    return True


def interface_for(address: str) -> str | None:
    """The name of the network interface that holds ``address`` (IPv4), or None."""
    import fcntl
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(packed[20:24]) == address:
                return name
    return None


def raise_fd_limit() -> None:
    """Raise the soft limit on open files to the hard one: each connection to a server is one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Linux refuses an unlimited soft limit on open files: its own ceiling (fs.nr_open) is 2**20.
    target = hard if hard != resource.RLIM_INFINITY else 2**20
    if soft == resource.RLIM_INFINITY or soft >= target:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as e:
        log.debug("could not raise the open-file limit from %s to %s: %s", soft, target, e)
