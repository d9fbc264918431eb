"""What a run on a Ray cluster asks for, and where its master listens: ``orch.Ray`` and its checks.

Checked when ``orch.Ray(...)`` is made, so a mistake is told in the cell that wrote it; the
checks of this machine (Ray installed, the cluster's address) run before anything starts.
Nothing here imports Ray: ``import orch`` never does.
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
from dataclasses import dataclass, field

from orch.errors import ConfigError
from orch.wire.net import address_towards, is_loopback, split_address


@dataclass(frozen=True)
class Ray:
    """Where and how to run on a Ray cluster: pass as ``orch.launch(..., cluster=orch.Ray(...))``.

    ``nodes * ranks_per_node`` ranks (the launch's ``world_size`` must match), placed as one
    bundle per node (``STRICT_SPREAD``: each on a node of its own), each bundle holding
    ``cpus_per_rank``, ``gpus_per_rank`` and ``resources`` (Ray's custom resources) for each of
    its ranks. One actor per node runs orch's host agent, which starts the node's ranks with
    torchrun's contract (``GROUP_RANK`` the node's place, ``LOCAL_RANK`` the rank's on it).
    ``address`` is the cluster's (its GCS, ``HOST:PORT``; ``"auto"``: ``$RAY_ADDRESS`` or the
    cluster this machine runs). ``master_addr`` is the address of this machine the nodes reach
    (default: the one on the route to the cluster's address). ``python`` is the interpreter the
    nodes run the agent with (default: this one, which must be on every node). The code reaches
    the nodes as on Slurm: through the shared run dir (a function, signed with the run's token)
    or the import path.
    """

    address: str = "auto"
    nodes: int = 1
    ranks_per_node: int = 1
    cpus_per_rank: float = 1.0
    gpus_per_rank: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)
    master_addr: str | None = None
    python: str | None = None
    poll_interval: float = 1.0

    def __post_init__(self) -> None:
        for name in ("nodes", "ranks_per_node"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ConfigError(f"Ray({name}=...) must be an integer >= 1, got {value!r}")
        for name in ("cpus_per_rank", "gpus_per_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"Ray({name}=...) must be a number >= 0, got {value!r}")
        if not isinstance(self.resources, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
            for k, v in self.resources.items()
        ):
            raise ConfigError(
                f"Ray(resources=...) must map resource names to numbers >= 0, got {self.resources!r}"
            )
        object.__setattr__(self, "resources", dict(self.resources))
        if not isinstance(self.address, str) or not (
            self.address == "auto" or self.address.startswith("ray://") or _is_host_port(self.address)
        ):
            raise ConfigError(
                f"Ray(address=...) must be 'auto' or the cluster's HOST:PORT, got {self.address!r}"
            )
        if not isinstance(self.poll_interval, (int, float)) or self.poll_interval <= 0:
            raise ConfigError(
                f"Ray(poll_interval=...) must be a positive number of seconds, got {self.poll_interval!r}"
            )

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def bundle(self) -> dict[str, float]:
        """What one node's bundle holds: its ranks' CPUs, GPUs and custom resources."""
        k = self.ranks_per_node
        held = {"CPU": self.cpus_per_rank * k}
        if self.gpus_per_rank:
            held["GPU"] = self.gpus_per_rank * k
        held.update({name: amount * k for name, amount in self.resources.items()})
        return held

    def describe(self) -> str:
        each = ", ".join(f"{v:g} {k}" for k, v in self.bundle().items())
        return f"{self.nodes} Ray node(s) of {self.ranks_per_node} ranks ({each} each)"

    def cluster_address(self) -> str:
        """The address ``ray.init`` is given."""
        if self.address == "auto":
            return os.environ.get("RAY_ADDRESS", "auto")
        return self.address


def _is_host_port(address: str) -> bool:
    try:
        split_address(address)
    except ConfigError:
        return False
    return True


def check_ray(cluster: Ray) -> None:
    """Ray is installed here, or a ConfigError says how to get it."""
    if importlib.util.find_spec("ray") is None:
        raise ConfigError(
            'cluster=orch.Ray(...) needs Ray in this environment: pip install "orch[ray]" '
            "(the same Ray version as the cluster's)"
        )


def check_reachable(cluster: Ray, timeout: float = 5.0) -> None:
    """The cluster's GCS answers at ``cluster.address`` (a TCP connection within ``timeout``),
    or a ConfigError names the address: ``ray.init`` would retry a wrong one for minutes,
    logging as it goes. ``"auto"`` and ``ray://`` addresses are left to Ray."""
    address = cluster.cluster_address()
    if address == "auto" or address.startswith("ray://"):
        return
    host, port = split_address(address)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        raise ConfigError(
            f"no Ray cluster answers at {address} (Ray(address=...)): {e.strerror or e}. Start one "
            "with `ray start --head`, or pass its GCS HOST:PORT (`ray status` on a node of it shows it)"
        ) from None


def ray_master_host(cluster: Ray) -> str:
    """The address the master binds for a Ray run: ``cluster.master_addr``, else this machine's
    address on the route to the cluster (loopback when the cluster is this machine's)."""
    if cluster.master_addr:
        return cluster.master_addr
    address = cluster.cluster_address()
    host = _host_of(address)
    if host is None:  # "auto": the cluster this machine runs
        return "127.0.0.1"
    if is_loopback(host):
        return "127.0.0.1"
    return address_towards(host, 6379)


def _host_of(address: str) -> str | None:
    if address == "auto":
        return None
    address = re.sub(r"^ray://", "", address)
    host, _ = split_address(address)
    return host
