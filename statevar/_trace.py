"""Trace frames: where variables live while `statevar.jit` or `statevar.grad` traces.

While a transformation traces a function, the variables it lifts are looked up in a frame
on a per-thread stack instead of in the variables themselves. Reads return the frame's
traced value and writes replace it; the variables' own arrays are never touched, so no
tracer can leak into a variable, and other threads keep seeing concrete arrays.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ._errors import TraceContextError

if TYPE_CHECKING:
    from ._variable import Variable

_local = threading.local()
# Number of frames open in any thread: while it is 0 (the eager hot path), nothing is traced
# and the thread-local lookup can be skipped. Read it as ``_trace.open_frames``.
open_frames = 0
_count_lock = threading.Lock()


class Frame:
    """Traced values of the variables one transformation has lifted.

    Attributes:
      kind: ``"jit"`` or ``"grad"``.
      values: the current traced value of each lifted variable.
      written: the variables assigned while tracing.
      unlifted: variables read while tracing that the frame did not lift; their concrete
        values were used (jit frames only).
    """

    def __init__(self, kind: str, values: dict[Variable, Any]):
        self.kind = kind
        self.values = values
        self.written: dict[Variable, None] = {}
        self.unlifted: dict[Variable, None] = {}

    def __enter__(self) -> Frame:
        global open_frames
        stack = _stack()
        stack.append(self)
        with _count_lock:
            open_frames += 1
        return self

    def __exit__(self, *exc_info: object) -> None:
        global open_frames
        _stack().pop()
        with _count_lock:
            open_frames -= 1


def _stack() -> list[Frame]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def innermost() -> Frame | None:
    """Returns this thread's innermost frame, or None."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def read(var: Variable) -> Any | None:
    """Returns ``var``'s traced value in this thread's frames, or None to read it eagerly.

    A jit frame that has not lifted ``var`` records it as unlifted, so `statevar.jit` can
    lift it on the next trace.
    """
    stack = getattr(_local, "stack", None)
    if not stack:
        return None
    for frame in reversed(stack):
        if var in frame.values:
            return frame.values[var]
    for frame in stack:
        if frame.kind == "jit":
            frame.unlifted[var] = None
            break
    return None


def write(frame: Frame, var: Variable, value: Any, operation: str) -> None:
    """Records an assignment to ``var`` made while ``frame`` traces.

    Raises:
      TraceContextError: inside `statevar.grad`, which differentiates a pure function.
    """
    if frame.kind == "grad":
        raise TraceContextError(
            f"Cannot {operation} Variable '{var.name}' inside statevar.grad: the "
            "differentiated function must not change variables. Return the new value "
            "(with has_aux=True) and assign it after the gradient call."
        )
    frame.values[var] = value
    frame.written[var] = None


def check_creation(name: str) -> None:
    """Refuses to create a variable while a transformation traces.

    Raises:
      TraceContextError: if a `statevar.jit` or `statevar.grad` frame is open.
    """
    frame = innermost()
    if frame is not None:
        where = "statevar.jit" if frame.kind == "jit" else "statevar.grad"
        raise TraceContextError(
            f"Cannot create Variable '{name}' inside {where}: variables hold state across "
            "calls, so create them once, outside the transformed function, and assign to "
            "them inside it (as tf.function requires)."
        )
