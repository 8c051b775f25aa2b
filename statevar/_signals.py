"""Holding Python's signal handlers while a donating call may run Python code.

A donating call deletes the variable's old array before it returns the new one. On JAX's
fast path the call runs in C++ and statevar stores the result with no bytecode (where
Python runs signal handlers) in between. The first call of a compiled update for new
argument types takes JAX's Python path instead, where a ``KeyboardInterrupt`` could land
after the donation and before the result is returned; `held_signals` defers the handlers
across that call.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

_main_thread = threading.main_thread()


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """Defers every Python-level signal handler until the block ends.

    A signal that arrives inside the block is raised again when it ends, after the
    original handlers are back, so a ``KeyboardInterrupt`` surfaces right after the block
    instead of inside it. Python runs signal handlers in the main thread only: elsewhere
    this does nothing.
    """
    if threading.current_thread() is not _main_thread:
        yield
        return
    caught: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        caught.append(signum)

    replaced: dict[int, Any] = {}
    try:
        for signum in signal.valid_signals():
            try:
                handler = signal.getsignal(signum)
            except (OSError, ValueError):
                continue
            if callable(handler):
                signal.signal(signum, hold)
                replaced[signum] = handler
        yield
    finally:
        for signum, handler in replaced.items():
            signal.signal(signum, handler)
        for signum in caught:
            signal.raise_signal(signum)
