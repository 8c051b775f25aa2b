"""Test setup: eight CPU devices, so placement and sharding tests run without a GPU."""

import contextlib
import gc
import signal
import threading

import jax
import pytest

jax.config.update("jax_num_cpu_devices", 8)

import statevar  # noqa: E402


def _has_gpu() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _reset_placement_settings():
    yield
    statevar.set_soft_device_placement(True)
    statevar.set_log_device_placement(False)


@pytest.fixture
def default_sigint_handler():
    """Python's own SIGINT handler (raising `KeyboardInterrupt`) for the test: a process
    started in the background of a shell without job control ignores SIGINT, and Python then
    installs none."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def first_calls(monkeypatch):
    """Counts the calls that hold signal handlers: first calls, whose JAX Python path runs
    after donating (an update or step JAX has not compiled for its arrays' commitment)."""
    counted = []
    real = statevar._signals.held_signals

    @contextlib.contextmanager
    def counting():
        counted.append(1)
        with real():
            yield

    monkeypatch.setattr(statevar._compile.step, "held_signals", counting)
    monkeypatch.setattr(statevar._cell.variable, "held_signals", counting)
    return counted


@pytest.fixture
def collect_garbage():
    """Returns a function that runs a full collection for certain.

    ``gc.collect()`` returns at once, collecting nothing, while another thread's collection
    is under way (paused in a finalizer that let go of the GIL): orbax's threads, or any
    other test's. So this one collects until a full collection has run in this thread.
    """

    def collect() -> None:
        caller = threading.get_ident()
        ran = []

        def note(phase, info):
            if phase == "stop" and info["generation"] == 2 and threading.get_ident() == caller:
                ran.append(True)

        gc.callbacks.append(note)
        try:
            while not ran:
                gc.collect()
        finally:
            gc.callbacks.remove(note)

    return collect
