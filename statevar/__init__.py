"""statevar: mutable, TensorFlow-style variables on JAX, updated in place."""

from . import random as random
from ._caches import clear_caches as clear_caches
from ._cell.copies import CopyWarning as CopyWarning
from ._cell.copies import copy_policy as copy_policy
from ._cell.copies import set_copy_policy as set_copy_policy
from ._cell.placement import PlacementWarning as PlacementWarning
from ._cell.placement import device as device
from ._cell.placement import mesh as mesh
from ._cell.placement import set_log_device_placement as set_log_device_placement
from ._cell.placement import set_soft_device_placement as set_soft_device_placement
from ._cell.variable import Variable as Variable
from ._checkpoint.async_saves import PendingSave as PendingSave
from ._checkpoint.manager import CheckpointManager as CheckpointManager
from ._checkpoint.save_restore import RestoreResult as RestoreResult
from ._checkpoint.save_restore import restore as restore
from ._checkpoint.save_restore import save as save
from ._compile.grad import grad as grad
from ._compile.grad import value_and_grad as value_and_grad
from ._compile.jit import jit as jit
from ._compile.memory_report import MemoryReport as MemoryReport
from ._compile.stateless import read_values as read_values
from ._compile.stateless import stateless_call as stateless_call
from ._distribute.per_replica import PerReplica as PerReplica
from ._distribute.reshard import reshard as reshard
from ._errors import CheckpointCorruptedError as CheckpointCorruptedError
from ._errors import CheckpointDamagedError as CheckpointDamagedError
from ._errors import CheckpointExistsError as CheckpointExistsError
from ._errors import CheckpointMismatchError as CheckpointMismatchError
from ._errors import CheckpointNotFoundError as CheckpointNotFoundError
from ._errors import CheckpointWriteError as CheckpointWriteError
from ._errors import CopyError as CopyError
from ._errors import DtypeMismatchError as DtypeMismatchError
from ._errors import OutOfMemoryError as OutOfMemoryError
from ._errors import PlacementError as PlacementError
from ._errors import ShapeMismatchError as ShapeMismatchError
from ._errors import StatevarError as StatevarError
from ._errors import TraceContextError as TraceContextError
from ._train.module import Module as Module
from ._train.optimizer import Optimizer as Optimizer
from ._train.pytree import OptimizerState as OptimizerState
from ._train.summary import summary as summary

__version__ = "0.1.0"

__all__ = [
    "CheckpointCorruptedError",
    "CheckpointDamagedError",
    "CheckpointExistsError",
    "CheckpointManager",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CheckpointWriteError",
    "CopyError",
    "CopyWarning",
    "DtypeMismatchError",
    "MemoryReport",
    "Module",
    "Optimizer",
    "OptimizerState",
    "OutOfMemoryError",
    "PendingSave",
    "PerReplica",
    "PlacementError",
    "PlacementWarning",
    "RestoreResult",
    "ShapeMismatchError",
    "StatevarError",
    "TraceContextError",
    "Variable",
    "clear_caches",
    "copy_policy",
    "device",
    "grad",
    "jit",
    "mesh",
    "read_values",
    "reshard",
    "restore",
    "save",
    "set_copy_policy",
    "set_log_device_placement",
    "set_soft_device_placement",
    "stateless_call",
    "summary",
    "value_and_grad",
]
