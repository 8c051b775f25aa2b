"""One process of `test_multiprocess`: joins a two-process `jax.distributed` run over
loopback, trains a small model data-parallel over both processes' devices, checkpoints it
with `statevar.save` and a `statevar.CheckpointManager`, and prints what the test checks as
one JSON line. Run as ``python multiprocess_worker.py PROCESS PORT DIRECTORY``."""

from __future__ import annotations

import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import statevar


class Linear(statevar.Module):
    def __init__(self):
        self.kernel = statevar.Variable(np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8))
        self.bias = statevar.Variable(np.zeros(8, np.float32))

    def __call__(self, x):
        return x @ self.kernel + self.bias


def train(model, x, y, steps=4):
    optimizer = statevar.Optimizer(optax.adam(0.1), model)

    @statevar.jit
    def step(x, y):
        loss, grads = statevar.value_and_grad(lambda: jnp.mean((model(x) - y) ** 2), model)()
        optimizer.apply(grads)
        return loss

    # Every process runs the same steps; each loss is waited for before the next step.
    return [float(step(x, y)) for _ in range(steps)], optimizer


def data():
    rng = np.random.default_rng(0)  # every process makes the same host values
    return rng.normal(size=(8, 4)).astype(np.float32), rng.normal(size=(8, 8)).astype(np.float32)


def main(process: int, port: int, directory: pathlib.Path) -> None:
    jax.config.update("jax_num_cpu_devices", 2)
    jax.distributed.initialize(
        f"127.0.0.1:{port}", num_processes=2, process_id=process, initialization_timeout=60
    )
    x, y = data()
    local = statevar.Variable(1.0, name="local")
    reference = Linear()
    reference_losses, _ = train(reference, x, y)  # on this process's first device alone

    mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Auto,))
    model = Linear()
    statevar.reshard(model, [("kernel", P(None, "data"))], mesh=mesh)
    batch = NamedSharding(mesh, P("data"))
    losses, optimizer = train(model, jax.device_put(x, batch), jax.device_put(y, batch))
    try:
        model.kernel.numpy()
        refused = ""
    except ValueError as error:
        refused = str(error)
    statevar.save(directory / "single", {"model": model, "optimizer": optimizer})
    statevar.CheckpointManager(directory / "managed").save(4, {"model": model})
    print(
        json.dumps(
            {
                "process": jax.process_index(),
                "devices": len(jax.devices()),
                "local_default": local.device in jax.local_devices(),
                "kernel_devices": len(model.kernel.sharding.device_set),
                "reference": reference_losses,
                "reference_params": {
                    name: v.numpy().tolist() for name, v in reference.named_variables().items()
                },
                "losses": losses,
                "refused": refused,
                # Replicated over both processes' devices (no rule shards it): each reads it.
                "bias": model.bias.numpy().tolist(),
            }
        ),
        flush=True,
    )
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), pathlib.Path(sys.argv[3]))
