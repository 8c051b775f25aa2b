"""Two processes on this machine, joined by `jax.distributed` over loopback (gloo
collectives on CPU), train one model data-parallel over all four of their devices: each
process's losses equal training on one device. Both checkpoint it, writing one checkpoint,
which this single process restores onto its own mesh. Bounded timeouts: the test stops by
itself."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import chex
import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import statevar

WORKER = pathlib.Path(__file__).resolve().parent / "multiprocess_worker.py"
ROOT = WORKER.parent.parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_processes_train_and_checkpoint_one_model_as_one_device_does(tmp_path):
    port = _free_port()
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    workers = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(process), str(port), str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
        )
        for process in range(2)
    ]
    outputs = []
    try:
        for worker in workers:
            stdout, stderr = worker.communicate(timeout=150)
            assert worker.returncode == 0, stderr[-3000:]
            outputs.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    assert sorted(output["process"] for output in outputs) == [0, 1]
    for output in outputs:
        assert output["devices"] == 4 and output["kernel_devices"] == 4
        assert output["local_default"]  # process 1's default device is its own
        np.testing.assert_allclose(output["losses"], output["reference"], rtol=1e-5, atol=1e-6)
        assert output["losses"][-1] < output["losses"][0]
        assert output["refused"].startswith(
            "Cannot read Variable 'kernel' into NumPy: it is spread over several processes"
        )
    np.testing.assert_allclose(outputs[0]["losses"], outputs[1]["losses"], rtol=1e-6)
    np.testing.assert_allclose(
        [output["bias"] for output in outputs],
        [outputs[0]["reference_params"]["bias"]] * 2,
        rtol=1e-5,
        atol=1e-6,
    )

    # One checkpoint, written by both processes, restored here onto eight devices.
    expected = {
        name: np.asarray(value, np.float32)
        for name, value in outputs[0]["reference_params"].items()
    }
    mesh = jax.make_mesh((8,), ("data",))
    for restore in (
        lambda model: statevar.restore(tmp_path / "single", {"model": model}, partial=True),
        lambda model: statevar.CheckpointManager(tmp_path / "managed").restore({"model": model}),
    ):
        model = _Linear()
        statevar.reshard(model, [("kernel", P(None, "data"))], mesh=mesh)
        result = restore(model)
        assert sorted(result.restored) == ["model/bias", "model/kernel"]
        assert model.kernel.sharding == NamedSharding(mesh, P(None, "data"))
        restored = {name: v.numpy() for name, v in model.named_variables().items()}
        chex.assert_trees_all_close(restored, expected, rtol=1e-5, atol=1e-5)
    assert sorted(p.name for p in (tmp_path / "managed").iterdir()) == ["4"]


class _Linear(statevar.Module):
    def __init__(self):
        self.kernel = statevar.Variable(np.zeros((4, 8), np.float32))
        self.bias = statevar.Variable(np.zeros(8, np.float32))
