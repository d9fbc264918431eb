"""The Ray cluster kind, as :mod:`orch.launchers.clusters` finds it: ``cluster=orch.Ray(...)``.

Loaded when a cluster is first named; Ray itself is imported only when a run uses it.
"""

from __future__ import annotations

from orch.launchers.clusters import ClusterKind
from orch.launchers.ray.flags import FLAGS
from orch.launchers.ray.gang import RayGangJob, on_ray_node
from orch.launchers.ray.launcher import RayLauncher
from orch.launchers.ray.options import Ray, check_ray, ray_master_host

KIND = ClusterKind(
    name="ray",
    options=Ray,
    launcher=lambda: RayLauncher,
    master_host=ray_master_host,
    check=check_ray,
    gang_job=lambda cluster, gang_id, restarts, tls: RayGangJob(cluster, gang_id, restarts, **tls),
    place_rank=on_ray_node,
    cli=FLAGS,
)
