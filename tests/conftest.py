"""Test setup: eight CPU devices, so placement and sharding tests run without a GPU."""

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
