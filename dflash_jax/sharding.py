"""The one table that maps logical axis names to mesh axes.

Every parameter and every activation that matters is annotated with *logical*
axis names (``"embed"``, ``"heads"``, ...). This module is the only place that
names the physical mesh axes ``data``, ``fsdp``, ``tensor`` and ``expert``; everything
else in the code base speaks logical names and asks this module for shardings.

The rules follow the usual FSDP + tensor-parallel layout (as in MaxText):
the batch is split over ``data`` and ``fsdp``; weights are split over ``fsdp``
along their embedding axis and over ``tensor`` along heads / MLP / vocabulary; a
mixture-of-experts target's expert weights are split over ``expert`` along their expert
axis (expert parallelism; everything else is replicated over it).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dflash_jax.errors import ConfigError

MESH_AXES = ("data", "fsdp", "tensor", "expert")

# logical axis -> mesh axis (or tuple of mesh axes, or None for replicated).
LOGICAL_AXIS_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    # activations
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("cache_length", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
    # parameters
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("latent", "fsdp"),  # MLA's latent rank (kv_lora_rank, q_lora_rank) of q_b_proj, kv_b_proj: FSDP (where not embed)
    ("expert", "expert"),
    ("norm", None),
    ("taps", None),
)


def make_mesh(shape: Sequence[int] = (1, 1, 1), devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Build a ``(data, fsdp, tensor, expert)`` mesh.

    Args:
      shape: three ints (data, fsdp, tensor; expert parallelism 1) or four (data, fsdp, tensor,
        expert), the size of each mesh axis; their product must not exceed the number of devices.
      devices: devices to use (default: ``jax.devices()``, the first ``prod(shape)``).

    Raises:
      ConfigError: ``shape`` is not three or four positive ints, or there are too few devices.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) not in (3, 4) or min(shape) < 1:
        raise ConfigError(f"mesh shape must be three or four positive ints (data, fsdp, tensor[, expert]), got {shape}")
    shape = shape + (1,) * (4 - len(shape))
    devices = list(jax.devices() if devices is None else devices)
    need = int(np.prod(shape))
    if need > len(devices):
        raise ConfigError(
            f"mesh {shape} needs {need} devices but only {len(devices)} are visible; on CPU set "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N before importing jax"
        )
    return Mesh(np.asarray(devices[:need]).reshape(shape), MESH_AXES)


def logical_to_sharding(logical_specs, mesh: Mesh):
    """Map a pytree of logical ``PartitionSpec`` to ``NamedSharding`` on ``mesh``."""
    return nn.logical_to_mesh_sharding(logical_specs, mesh, LOGICAL_AXIS_RULES)


def logical_spec(*axes: str | None) -> PartitionSpec:
    """The mesh ``PartitionSpec`` for one array annotated with logical ``axes``."""
    return nn.logical_to_mesh_axes(axes, LOGICAL_AXIS_RULES)


def named_sharding(mesh: Mesh, *axes: str | None) -> NamedSharding:
    """``NamedSharding`` on ``mesh`` for one array annotated with logical ``axes``."""
    return NamedSharding(mesh, logical_spec(*axes))


def axis_rules():
    """Context manager that activates the table for ``nn.with_logical_constraint``."""
    return nn.logical_axis_rules(LOGICAL_AXIS_RULES)


def placed(shapes, mesh: Mesh | None = None, logical_specs=None, dtype=None):
    """``shapes`` (a pytree of ``ShapeDtypeStruct``) with a sharding on every leaf, to restore into.

    With ``mesh``: laid out by the table from ``logical_specs`` (a matching pytree of logical
    ``PartitionSpec``); without: on this process's first device (so orbax returns device arrays, not numpy
    copies). ``dtype``: cast every leaf (default: keep each leaf's).
    """
    if mesh is None:
        one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])  # this process's first
        return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype or s.dtype, sharding=one), shapes)
    shardings = logical_to_sharding(logical_specs, mesh)
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, dtype or s.dtype, sharding=sh), shapes, shardings)


def batch_shardings(mesh: Mesh, features: bool = False) -> dict[str, NamedSharding]:
    """Shardings of a training batch ``[accum, b, T]`` (``tokens``, ``loss_mask``; with ``features``
    also ``features`` ``[accum, b, T, F]``): rows split over ``data`` x ``fsdp``, the rest whole."""
    out = {k: named_sharding(mesh, None, "batch", "length") for k in ("tokens", "loss_mask")}
    if features:
        out["features"] = named_sharding(mesh, None, "batch", "length", None)
    return out
