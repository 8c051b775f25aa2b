"""Per-step cost of sharded training steps: statevar against hand-written pure JAX.

On one mesh of eight devices (virtual CPU devices unless the machine has eight), the same
MLP step (forward, gradients, Adam) runs two ways for two layouts:

- data-parallel: parameters and optimizer state replicated, the batch split over ``data``;
- FSDP: weight matrices (and their Adam moments) split along ``data`` too, gathered by XLA
  where the step uses them (an Auto mesh).

statevar: a `statevar.Module` placed by `statevar.reshard`, a `statevar.Optimizer`, one
`statevar.jit` step. Pure JAX: the parameters and optax state as arrays with the same
shardings, a `jax.jit` step donating them and pinning its outputs' shardings.

Each variant runs ``--steps-per-round`` steps back to back and waits for the last (few
enough to keep XLA's CPU collectives from piling up); the variants take turns round after
round, in the order of `schedule.turns`. Prints the median over rounds of the mean step
time, and the ratio to pure JAX. Target: statevar at most 1.05x; a miss prints FAIL (exit
status 0: it reports, it does not gate).

    python benchmarks/sharded_step.py [--rounds 40] [--steps-per-round 10]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import jax

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from schedule import turns  # noqa: E402

import statevar  # noqa: E402

IN_FEATURES, HIDDEN, OUT_FEATURES, BATCH = 256, 512, 16, 256
TARGET = 1.05
LAYOUTS = {"data-parallel": [], "FSDP": [("kernel", P("data", None))]}


def initial_params() -> dict[str, jax.Array]:
    key_1, key_2 = jax.random.split(jax.random.key(1))
    return {
        "kernel_1": jax.random.normal(key_1, (IN_FEATURES, HIDDEN)) / IN_FEATURES**0.5,
        "bias_1": jnp.zeros(HIDDEN),
        "kernel_2": jax.random.normal(key_2, (HIDDEN, OUT_FEATURES)) / HIDDEN**0.5,
    }


def forward(params: dict, x: jax.Array) -> jax.Array:
    hidden = jax.nn.relu(x @ params["kernel_1"] + params["bias_1"])
    return hidden @ params["kernel_2"]


def statevar_step(mesh: jax.sharding.Mesh, rules: list) -> Callable:
    class MLP(statevar.Module):
        def __init__(self, params: dict[str, jax.Array]):
            for name, value in params.items():
                setattr(self, name, statevar.Variable(value))

    model = MLP(initial_params())
    statevar.reshard(model, rules, mesh=mesh)
    optimizer = statevar.Optimizer(optax.adam(1e-3), model)

    @statevar.jit
    def step(x: jax.Array, y: jax.Array) -> jax.Array:
        def loss() -> jax.Array:
            params = {name: v.value for name, v in model.named_variables().items()}
            return jnp.mean((forward(params, x) - y) ** 2)

        value, grads = statevar.value_and_grad(loss, model)()
        optimizer.apply(grads)
        return value

    return step


def jax_step(mesh: jax.sharding.Mesh, rules: list) -> Callable:
    tx = optax.adam(1e-3)
    shardings = {
        name: NamedSharding(mesh, next((spec for regex, spec in rules if regex in name), P()))
        for name in initial_params()
    }
    params = jax.device_put(initial_params(), shardings)
    opt_state = tx.init(params)  # the moments take their parameters' shardings
    replicated = NamedSharding(mesh, P())
    state_shardings = jax.tree.map(
        lambda a: a.sharding if len(a.sharding.device_set) > 1 else replicated, opt_state
    )
    opt_state = jax.device_put(opt_state, state_shardings)  # the count, replicated

    def loss_fn(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.mean((forward(params, x) - y) ** 2)

    def pure_step(params, opt_state, x, y):
        value, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    compiled = jax.jit(
        pure_step,
        donate_argnums=(0, 1),
        out_shardings=(shardings, state_shardings, NamedSharding(mesh, P())),
    )
    state = [params, opt_state]

    def step(x: jax.Array, y: jax.Array) -> jax.Array:
        state[0], state[1], value = compiled(state[0], state[1], x, y)
        return value

    return step


def time_round(step: Callable, args: tuple, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        result = step(*args)
    result.block_until_ready()
    return (time.perf_counter() - start) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--steps-per-round", type=int, default=10)
    args = parser.parse_args()
    devices = jax.devices()[:8]
    mesh = jax.make_mesh((len(devices),), ("data",), axis_types=(AxisType.Auto,), devices=devices)
    key_x, key_y = jax.random.split(jax.random.key(0))
    batch = NamedSharding(mesh, P("data", None))
    x = jax.device_put(jax.random.normal(key_x, (BATCH, IN_FEATURES)), batch)
    y = jax.device_put(jax.random.normal(key_y, (BATCH, OUT_FEATURES)), batch)
    print(
        f"statevar {statevar.__version__}, jax {jax.__version__}, {platform.machine()}, "
        f"{len(devices)} {devices[0].platform} devices; MLP {IN_FEATURES}->{HIDDEN}->"
        f"{OUT_FEATURES}, batch {BATCH}, adam; {args.rounds} rounds of "
        f"{args.steps_per_round} steps, median of the per-round mean"
    )
    failed = False
    for layout, rules in LAYOUTS.items():
        steps = {"pure jax.jit": jax_step(mesh, rules), "statevar.jit": statevar_step(mesh, rules)}
        names = list(steps)
        for name in names:  # compile and warm up
            time_round(steps[name], (x, y), 3)
        samples: dict[str, list[float]] = {name: [] for name in names}
        for order in turns(names, args.rounds):
            for name in order:
                samples[name].append(time_round(steps[name], (x, y), args.steps_per_round))
        # The same steps from the same start: the same loss, or the comparison is void.
        losses = {name: float(steps[name](x, y)) for name in names}
        if abs(losses["statevar.jit"] - losses["pure jax.jit"]) > 1e-4 * abs(
            losses["pure jax.jit"]
        ):
            raise SystemExit(f"{layout}: the two steps disagree: {losses}")
        baseline = statistics.median(samples["pure jax.jit"])
        ratio = statistics.median(samples["statevar.jit"]) / baseline
        verdict = "ok" if ratio <= TARGET else "FAIL"
        failed |= verdict == "FAIL"
        print(
            f"\n{layout} step (loss after {args.rounds * args.steps_per_round + 4} steps: "
            f"{losses['statevar.jit']:.4e} both)"
        )
        for name in names:
            median = statistics.median(samples[name])
            print(f"  {name:<14} {median * 1e6:9.1f} us/step  {median / baseline:5.2f}x")
        print(f"  statevar / pure JAX: {ratio:.3f}x (target <= {TARGET}x) {verdict}")
    print("\nall targets met" if not failed else "\nsome targets missed")


if __name__ == "__main__":
    main()
