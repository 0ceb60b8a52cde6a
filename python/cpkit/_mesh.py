"""The CP group of a mesh argument: a 1-D DeviceMesh, a named dimension of a larger mesh
(``mesh["cp"]``), a ProcessGroup, or None (CP = 1). The ops receive the group's name, as
PyTorch's functional collectives do, and resolve it in C++."""

from __future__ import annotations

from typing import Optional, Union

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from ._errors import raise_error

Mesh = Union[DeviceMesh, dist.ProcessGroup, None]


def cp_group(mesh: Mesh) -> Optional[dist.ProcessGroup]:
    """The process group of the CP dimension, or None for CP = 1."""
    if mesh is None:
        return None
    if isinstance(mesh, DeviceMesh):
        if mesh.ndim != 1:
            names = getattr(mesh, "mesh_dim_names", None)
            raise_error(
                "mesh",
                f"is a {mesh.ndim}-D DeviceMesh (dimensions {names}); pass its CP dimension, "
                f"e.g. mesh['cp']",
            )
        return mesh.get_group()
    if isinstance(mesh, dist.ProcessGroup):
        return mesh
    raise_error(
        "mesh",
        f"must be a DeviceMesh, a ProcessGroup or None, got {type(mesh).__name__}",
    )
    return None  # unreachable


def group_name(mesh: Mesh) -> str:
    """The name the ops resolve in C++; "" for CP = 1."""
    group = cp_group(mesh)
    if group is None or group.size() == 1:
        return ""
    return group.group_name


def cp_size_and_rank(mesh: Mesh) -> tuple[int, int]:
    group = cp_group(mesh)
    if group is None:
        return 1, 0
    return group.size(), group.rank()
