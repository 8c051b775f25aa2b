"""Device scopes, soft placement and placement logging."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import warnings
from collections.abc import Iterator

import jax

from ._errors import PlacementError

logger = logging.getLogger("statevar")

_DEVICE_PATTERN = re.compile(r"^(?:.*device:)?([A-Za-z]+)(?::(\d+))?$")
_PLATFORM_ALIASES = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "rocm": "gpu", "tpu": "tpu"}


class PlacementWarning(UserWarning):
    """Soft placement moved a variable or computation to the default device."""


class _Settings:
    soft_placement = True
    log_placement = False


_settings = _Settings()
_scopes = threading.local()


def set_soft_device_placement(enabled: bool) -> None:
    """Turns soft device placement on or off (on by default).

    With soft placement on, asking for a device this machine lacks (``"gpu:0"`` on a
    CPU-only machine) places on the default device and warns with `PlacementWarning`.
    With it off, the same request raises `PlacementError`.

    Args:
      enabled: whether to fall back to the default device.
    """
    _settings.soft_placement = bool(enabled)


def set_log_device_placement(enabled: bool) -> None:
    """Turns logging of variable placement on or off (off by default).

    When on, every variable creation and update logs the variable's name, the operation and
    the device at level INFO on the ``"statevar"`` logger.

    Args:
      enabled: whether to log.
    """
    _settings.log_placement = bool(enabled)


def describe(device: jax.Device) -> str:
    """Returns the short form of a device, e.g. ``"cpu:0"``."""
    return f"{device.platform}:{device.id}"


def _available() -> str:
    return ", ".join(describe(d) for d in jax.devices())


def resolve(spec: str | jax.Device, *, what: str = "", stacklevel: int = 2) -> jax.Device:
    """Turns a device spec into a `jax.Device`, applying soft placement.

    Args:
      spec: ``"cpu"``, ``"cpu:0"``, ``"gpu:0"``, a TF-style ``"/device:GPU:0"``, or a
        `jax.Device`.
      what: what is being placed, for messages (e.g. ``"Variable 'w'"``).
      stacklevel: how far up the stack the caller to blame for the warning is.

    Returns:
      The device to use.

    Raises:
      TypeError: if ``spec`` is neither a string nor a `jax.Device`.
      ValueError: if ``spec`` is a string that does not name a device.
      PlacementError: if the device does not exist and soft placement is off.
    """
    if isinstance(spec, jax.Device):
        return spec
    if not isinstance(spec, str):
        raise TypeError(
            f"Expected a device spec such as 'cpu:0' or a jax.Device, got {type(spec).__name__}"
        )
    match = _DEVICE_PATTERN.match(spec.strip())
    platform = _PLATFORM_ALIASES.get(match.group(1).lower()) if match else None
    if platform is None:
        raise ValueError(
            f"Cannot parse device spec {spec!r}: expected 'cpu', 'gpu' or 'tpu', "
            "optionally with an index, e.g. 'gpu:0'"
        )
    index = int(match.group(2) or 0)
    try:
        devices = jax.devices(platform)
    except RuntimeError:
        devices = []
    if index < len(devices):
        return devices[index]
    subject = f"{what} on " if what else ""
    if not _settings.soft_placement:
        raise PlacementError(
            f"Cannot place {subject}{spec!r}: no such device. Available devices: "
            f"{_available()}. Call statevar.set_soft_device_placement(True) to fall back "
            "to the default device."
        )
    fallback = jax.devices()[0]
    warnings.warn(
        f"Device {spec!r} does not exist; placing {subject or ''}{describe(fallback)} "
        f"instead (soft device placement). Available devices: {_available()}.",
        PlacementWarning,
        stacklevel=stacklevel + 1,
    )
    return fallback


@contextlib.contextmanager
def device(spec: str | jax.Device) -> Iterator[jax.Device]:
    """Places variables created, and arithmetic on variables run, inside the block.

    Like ``tf.device``: variables created in the scope live on its device, and arithmetic on
    variables in the scope copies its operands to that device and runs there. Scopes nest and
    are per thread.

    Args:
      spec: ``"cpu"``, ``"cpu:0"``, ``"gpu:0"`` or a `jax.Device`.

    Yields:
      The resolved `jax.Device` (the default device if soft placement fell back).

    Raises:
      PlacementError: if the device does not exist and soft placement is off.

    Example:
      >>> import statevar
      >>> with statevar.device("cpu:0"):
      ...     v = statevar.Variable([1.0, 2.0])
      >>> v.device.platform
      'cpu'
    """
    resolved = resolve(spec, stacklevel=3)
    stack = _scope_stack()
    stack.append(resolved)
    try:
        yield resolved
    finally:
        stack.pop()


def _scope_stack() -> list[jax.Device]:
    stack = getattr(_scopes, "stack", None)
    if stack is None:
        stack = _scopes.stack = []
    return stack


def current_device() -> jax.Device | None:
    """Returns the innermost `device` scope's device, or None outside any scope."""
    stack = getattr(_scopes, "stack", None)
    return stack[-1] if stack else None


def log(name: str, operation: str, placed_on: jax.Device) -> None:
    """Logs a placement when placement logging is on."""
    if _settings.log_placement:
        logger.info("Variable '%s': %s on %s", name, operation, describe(placed_on))
