"""Trains an MLP data-parallel and FSDP-style over every available device with statevar.

The same model and data train three ways: on one device; data-parallel (every parameter
replicated over a mesh, the batch split along its ``"data"`` axis); and FSDP-style (each
weight matrix also split along ``"data"``, gathered by the compiled step where it is used).
`statevar.reshard` places the model's variables by rules on their paths; the Optimizer's
state takes each parameter's sharding; every step is one `statevar.jit` call that updates
every shard in place. The three runs end with the same losses and parameters.

On a CPU-only machine, ask XLA for several virtual devices first:

    python examples/train_sharded.py --cpu-devices 8 [--steps 50]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import statevar

IN_FEATURES, HIDDEN, OUT_FEATURES = 16, 64, 4
# Block on the loss every few steps: a bounded number of collectives in flight (XLA's CPU
# all-reduce can deadlock with dozens queued on a machine with few cores).
BLOCK_EVERY = 4


class MLP(statevar.Module):
    """Two dense layers; on one device, or over a mesh once `statevar.reshard` placed it."""

    def __init__(self, seed: int = 0):
        key_1, key_2 = jax.random.split(jax.random.key(seed))
        self.kernel_1 = statevar.Variable(
            lambda: jax.random.normal(key_1, (IN_FEATURES, HIDDEN)) / IN_FEATURES**0.5
        )
        self.bias_1 = statevar.Variable(jnp.zeros(HIDDEN))
        self.kernel_2 = statevar.Variable(
            lambda: jax.random.normal(key_2, (HIDDEN, OUT_FEATURES)) / HIDDEN**0.5
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        hidden = jax.nn.relu(x @ self.kernel_1 + self.bias_1)
        return hidden @ self.kernel_2


def make_data(batch: int, batches: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batches, batch, IN_FEATURES)).astype(np.float32)
    true_kernel = rng.normal(size=(IN_FEATURES, OUT_FEATURES)).astype(np.float32)
    return x, np.tanh(x @ true_kernel)


def train(
    strategy: str, steps: int, batch: int, mesh: jax.sharding.Mesh | None = None
) -> tuple[list[float], dict[str, np.ndarray]]:
    """Trains a fresh model with ``strategy`` ("single", "data_parallel" or "fsdp"); returns
    the losses and the final parameters."""
    model = MLP()
    if strategy == "data_parallel":
        statevar.reshard(model, [], mesh=mesh)  # every variable replicated
    elif strategy == "fsdp":
        statevar.reshard(model, [("kernel", P("data", None))], mesh=mesh)
    optimizer = statevar.Optimizer(optax.adam(1e-2), model)
    seen = None
    if mesh is not None:
        # Each replica counts the examples it trained on; a read sums them (an on-read
        # variable, as TensorFlow keeps metrics under a distribution strategy).
        seen = statevar.Variable(
            0,
            synchronization="on_read",
            aggregation="sum",
            sharding=NamedSharding(mesh, P()),
            name="examples_seen",
        )

    @statevar.jit
    def step(x: jax.Array, y: jax.Array) -> jax.Array:
        def loss() -> jax.Array:
            return jnp.mean((model(x) - y) ** 2)

        value, grads = statevar.value_and_grad(loss, model)()
        optimizer.apply(grads)
        if seen is not None:
            rows = jnp.ones(x.shape[0], jnp.int32).reshape(seen.replicas, -1).sum(axis=1)
            seen.assign_add(statevar.PerReplica(rows))  # no communication between replicas
        return value

    xs, ys = make_data(batch, batches=4)
    if mesh is not None:
        batch_sharding = NamedSharding(mesh, P("data", None))
        xs = [jax.device_put(x, batch_sharding) for x in xs]
        ys = [jax.device_put(y, batch_sharding) for y in ys]
    losses = []
    for i in range(steps):
        losses.append(step(xs[i % len(xs)], ys[i % len(ys)]))
        if (i + 1) % BLOCK_EVERY == 0:
            losses[-1].block_until_ready()
    if seen is not None:
        print(f"{strategy:>13}: {int(seen)} examples, {seen.replica_values.tolist()} per replica")
    return [float(loss) for loss in losses], {
        name: variable.numpy() for name, variable in model.named_variables().items()
    }


def main(argv: Sequence[str] | None = None) -> dict[str, tuple[list[float], dict]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument(
        "--cpu-devices", type=int, default=None, help="virtual CPU devices (set before JAX starts)"
    )
    args = parser.parse_args(argv)
    if args.cpu_devices is not None:
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    devices = len(jax.devices())
    if args.batch % devices:
        parser.error(f"--batch {args.batch} must be a multiple of the {devices} devices")
    # Auto axes: XLA gathers the FSDP weights where the step uses them (on Explicit axes, the
    # model would say so with jax.sharding.reshard).
    mesh = jax.make_mesh((devices,), ("data",), axis_types=(AxisType.Auto,))
    print(f"{devices} devices: {jax.devices()[0].platform}")
    results = {"single": train("single", args.steps, args.batch)}
    for strategy in ("data_parallel", "fsdp"):
        results[strategy] = train(strategy, args.steps, args.batch, mesh)
    for strategy, (losses, params) in results.items():
        gap = max(
            float(np.max(np.abs(params[name] - results["single"][1][name]))) for name in params
        )
        print(
            f"{strategy:>13}: loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
            f"largest parameter difference from one device {gap:.1e}"
        )
    return results


if __name__ == "__main__":
    main()
