"""Eager gradients and dropped compiled steps: statevar against the same code in pure JAX.

Measured in one run, printed as ratios to pure JAX, on tanh MLPs of 32x32 layers (batch 16)
with 4, 32 and 96 variables (2, 16 and 48 layers, a kernel and a bias each):

- **Eager gradient**: `statevar.grad` of the loss, called eagerly, operation by operation,
  against eager `jax.grad` of the same pure function; flax nnx's `nnx.grad` beside, for
  reference (not a target).
- **Eager update**: `statevar.Optimizer.apply` (``optax.adam``) outside any jit, against
  optax's ``update`` + ``apply_updates`` of the same gradients in a `jax.jit` donating the
  parameters and the optimizer state (what a careful pure-JAX loop calls eagerly).
- **Eager step**: `statevar.grad` then `Optimizer.apply` against `jax.grad` then optax's
  ``update`` + ``apply_updates``, both eager.
- **Compilations after warm-up**: JAX compilations (``jax.monitoring``'s backend-compile
  events) during the timed calls of each eager variant, after 5 warm-up calls. Pure JAX
  compiles nothing there; neither may statevar.
- **Memory**: the growth of the process's resident set (RSS) over 10,000 eager gradient
  calls, and over 1,000 compiled steps each made (`statevar.jit` / `jax.jit` of a new
  function), called once and dropped. Each loop runs in a fresh Python process (the script
  starts itself with ``--child``), after a warm-up of 5% of its calls, so JAX's own
  one-time caches are not counted.

Every eager variant of every size takes its turn round after round, in the order of
`schedule.turns` (each variant runs right after each other one equally often, over a
multiple of 42 rounds for 21 variants), each turn timing as many calls as last about as
long as ``--calls-per-round`` eager `jax.grad` calls of the smallest model (measured after
the warm-up: many calls of a cheap update, a few of a large gradient), the last waited
for; the reported time is the median of the rounds' mean call times. Targets (`TARGETS`,
one per row of `COMPARISONS`): the eager gradient and the eager update at most 1.1x pure
JAX at every size, the eager step at most 1.5x, no compilation after warm-up, and each
memory growth at most twice pure JAX's plus `RSS_NOISE_MIB` (RSS counts the whole process:
a few MiB of allocator noise either way). ``--check`` exits 1 on a miss.

    python benchmarks/eager.py [--rounds 42] [--calls-per-round 14] [--sizes 4 32 96] [--check]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from schedule import turns

import statevar

WIDTH, BATCH = 32, 16
SIZES = (4, 32, 96)  # variables: a kernel and a bias per layer
MEMORY_SIZE = 4  # the model of the memory loops
EAGER_CALLS, DROPPED_STEPS = 10_000, 1_000
LEARNING_RATE = 1e-3
RSS_NOISE_MIB = 8.0
TARGETS = {"gradient": 1.1, "update": 1.1, "step": 1.5, "compilations": 0, "memory factor": 2.0}


@dataclasses.dataclass(frozen=True)
class Comparison:
    """A row of the report: statevar's variant against pure JAX's, with peers beside."""

    kind: str  # its target's key in TARGETS
    ours: str
    baseline: str
    references: tuple[str, ...] = ()


COMPARISONS = (
    Comparison("gradient", "statevar.grad", "jax.grad", references=("nnx.grad",)),
    Comparison("update", "Optimizer.apply", "optax update (jax.jit, donated)"),
    Comparison("step", "statevar.grad + Optimizer.apply", "jax.grad + optax"),
)


# ------------------------------------------------------------------------ the workloads


def batch() -> tuple[jax.Array, jax.Array]:
    x = jax.random.normal(jax.random.key(0), (BATCH, WIDTH))
    return x, jnp.sin(x)


def initial_parameters(size: int) -> list[jax.Array]:
    """A kernel and a bias for each of ``size // 2`` layers, in order."""
    parameters = []
    for key in jax.random.split(jax.random.key(1), size // 2):
        parameters += [jax.random.normal(key, (WIDTH, WIDTH)) / WIDTH**0.5, jnp.zeros(WIDTH)]
    return parameters


def mlp_loss(parameters: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    """The same loss for all: pure JAX passes arrays, statevar its Variables, nnx values."""
    hidden = x
    for kernel, bias in zip(parameters[::2], parameters[1::2], strict=True):
        hidden = jnp.tanh(hidden @ kernel + bias)
    return jnp.mean((hidden - y) ** 2)


class MLP(statevar.Module):
    def __init__(self, size: int) -> None:
        self.parameters = [statevar.Variable(value) for value in initial_parameters(size)]

    def loss(self, x: jax.Array, y: jax.Array) -> jax.Array:
        return mlp_loss(self.parameters, x, y)


class NnxMLP(nnx.Module):
    def __init__(self, size: int) -> None:
        self.parameters = nnx.data([nnx.Param(value) for value in initial_parameters(size)])


def nnx_loss(model: NnxMLP, x: jax.Array, y: jax.Array) -> jax.Array:
    return mlp_loss([p[...] for p in model.parameters], x, y)


def optax_update(tx: optax.GradientTransformation) -> Callable:
    """optax's update + apply_updates, compiled, donating the parameters and the state."""

    @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
    def update(params: Any, opt_state: Any, count: jax.Array, grads: Any) -> Any:
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, count + 1  # as iterations

    return update


def gradient_variants(size: int) -> dict[str, Callable[[], Any]]:
    x, y = batch()
    model, nnx_model, params = MLP(size), NnxMLP(size), initial_parameters(size)
    grad, jax_grad, nnx_grad = (
        statevar.grad(model.loss, model),
        jax.grad(mlp_loss),
        nnx.grad(nnx_loss),
    )
    return {
        "statevar.grad": lambda: grad(x, y),
        "jax.grad": lambda: jax_grad(params, x, y),
        "nnx.grad": lambda: nnx_grad(nnx_model, x, y),
    }


def update_variants(size: int) -> dict[str, Callable[[], Any]]:
    """Both apply the same gradients (of the initial parameters) each call."""
    x, y = batch()
    model = MLP(size)
    model_grads = statevar.grad(model.loss, model)(x, y)  # keyed by path: "parameters/0"
    grads = list(model_grads.values())
    optimizer = statevar.Optimizer(optax.adam(LEARNING_RATE), model)

    def statevar_update() -> Any:
        optimizer.apply(model_grads)
        return model.parameters[0].value

    tx = optax.adam(LEARNING_RATE)
    update = optax_update(tx)
    params = initial_parameters(size)
    state: list[Any] = [params, tx.init(params), jnp.zeros((), jnp.int32)]

    def jax_update() -> Any:
        state[0], state[1], state[2] = update(*state, grads)
        return state[0][0]

    return {"Optimizer.apply": statevar_update, "optax update (jax.jit, donated)": jax_update}


def step_variants(size: int) -> dict[str, Callable[[], Any]]:
    x, y = batch()
    model = MLP(size)
    optimizer = statevar.Optimizer(optax.adam(LEARNING_RATE), model)
    grad = statevar.grad(model.loss, model)

    def statevar_step() -> Any:
        optimizer.apply(grad(x, y))
        return model.parameters[0].value

    jax_grad = jax.grad(mlp_loss)
    tx = optax.adam(LEARNING_RATE)
    state: dict[str, Any] = {"params": initial_parameters(size)}
    state["opt"] = tx.init(state["params"])

    def jax_step() -> Any:
        grads = jax_grad(state["params"], x, y)
        updates, state["opt"] = tx.update(grads, state["opt"], state["params"])
        state["params"] = optax.apply_updates(state["params"], updates)
        return state["params"][0]

    return {"statevar.grad + Optimizer.apply": statevar_step, "jax.grad + optax": jax_step}


WORKLOADS = (gradient_variants, update_variants, step_variants)


def eager_variants(sizes: tuple[int, ...]) -> dict[tuple[int, str], Callable[[], Any]]:
    """Each variant, keyed by (number of variables, name): a function running one eager
    call and returning what it computed."""
    return {
        (size, name): run
        for size in sizes
        for workload in WORKLOADS
        for name, run in workload(size).items()
    }


class CompileCounter:
    """Counts XLA compilations, as ``jax.monitoring`` reports them."""

    def __init__(self) -> None:
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event: str, duration: float, **_: Any) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            self.count += 1


Key = tuple[int, str]


def timed_calls(run: Callable[[], Any], count: int) -> float:
    """Seconds per call of ``count`` calls of ``run``, the last waited for."""
    start = time.perf_counter()
    for _ in range(count - 1):
        run()
    jax.block_until_ready(run())
    return (time.perf_counter() - start) / count


def time_eager(
    rounds: int, calls: int, sizes: tuple[int, ...]
) -> tuple[dict[Key, float], dict[Key, int]]:
    """Median seconds per call of each eager variant, and its compilations after warm-up.

    Each turn of a variant lasts about as long as ``calls`` calls of the first comparison's
    baseline at the smallest size: many calls of a cheap update, a few of a large gradient.
    """
    counter = CompileCounter()
    variants = eager_variants(sizes)
    compilations = dict.fromkeys(variants, 0)
    per_call = {}
    for key, run in variants.items():
        for _ in range(5):
            jax.block_until_ready(run())
        per_call[key] = min(timed_calls(run, 2) for _ in range(3))
    turn = calls * per_call[min(sizes), COMPARISONS[0].baseline]
    counts = {key: max(2, round(turn / seconds)) for key, seconds in per_call.items()}
    samples: dict[Key, list[float]] = {key: [] for key in variants}
    for order in turns(variants, rounds):
        for key in order:
            before = counter.count
            samples[key].append(timed_calls(variants[key], counts[key]))
            compilations[key] += counter.count - before
    return {key: statistics.median(s) for key, s in samples.items()}, compilations


# ------------------------------------------------------------------------------ memory


def resident_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def eager_loop(variant: str) -> Callable[[], Any]:
    x, y = batch()
    if variant == "statevar":
        model = MLP(MEMORY_SIZE)
        return lambda: statevar.grad(model.loss, model)(x, y)
    params = initial_parameters(MEMORY_SIZE)
    return lambda: jax.grad(mlp_loss)(params, x, y)


def dropped_step(variant: str) -> Callable[[], Any]:
    """Makes a new compiled step, calls it once, and drops it."""
    x, y = batch()
    if variant == "statevar":
        model = MLP(MEMORY_SIZE)

        def run_statevar() -> Any:
            @statevar.jit
            def step(x: jax.Array, y: jax.Array) -> jax.Array:
                loss, grads = statevar.value_and_grad(model.loss, model)(x, y)
                for variable, g in zip(model.parameters, grads.values(), strict=True):
                    variable.assign_sub(0.01 * g)
                return loss

            return step(x, y)

        return run_statevar
    state = {"params": initial_parameters(MEMORY_SIZE)}

    def run_jax() -> Any:
        def step(params: Any, x: jax.Array, y: jax.Array) -> Any:
            loss, grads = jax.value_and_grad(mlp_loss)(params, x, y)
            return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), loss

        state["params"], loss = jax.jit(step, donate_argnums=0)(state["params"], x, y)
        return loss

    return run_jax


LOOPS = {"eager calls": (eager_loop, EAGER_CALLS), "dropped steps": (dropped_step, DROPPED_STEPS)}


def child(loop: str, variant: str) -> None:
    """Runs one memory loop in this (fresh) process and prints its RSS growth in MiB."""
    make, calls = LOOPS[loop]
    run = make(variant)
    for _ in range(max(1, calls // 20)):
        jax.block_until_ready(run())
    gc.collect()
    before = resident_mib()
    for index in range(calls):
        result = run()
        if index % 50 == 0:
            jax.block_until_ready(result)
    jax.block_until_ready(result)
    gc.collect()
    print(json.dumps({"growth_mib": resident_mib() - before}))


def memory_growth(loop: str, variant: str) -> float:
    output = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", loop, variant],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(output.strip().splitlines()[-1])["growth_mib"]


# ------------------------------------------------------------------------------ report


def report_eager(
    times: dict[Key, float], compilations: dict[Key, int], sizes: tuple[int, ...]
) -> list[str]:
    """Prints each comparison at every size; returns the targets it missed."""
    missed = []
    print(f"\n{'eager call':<36}{'variables':>10}{'ms/call':>10}{'ratio':>8}{'compiles':>10}")
    for comparison in COMPARISONS:
        for size in sizes:
            baseline = times[size, comparison.baseline]
            for name in (comparison.ours, comparison.baseline, *comparison.references):
                shown = f"{times[size, name] / baseline:.2f}x"
                print(
                    f"{name:<36}{size:>10}{times[size, name] * 1e3:>10.3f}{shown:>8}"
                    f"{compilations[size, name]:>10}"
                )
            ratio, target = times[size, comparison.ours] / baseline, TARGETS[comparison.kind]
            if ratio > target:
                missed.append(
                    f"eager {comparison.kind}, {size} variables: {ratio:.2f}x > {target}x"
                )
            if compilations[size, comparison.ours] > TARGETS["compilations"]:
                missed.append(
                    f"eager {comparison.kind}, {size} variables: "
                    f"{compilations[size, comparison.ours]} compilations after warm-up"
                )
        print()
    return missed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=42)
    parser.add_argument("--calls-per-round", type=int, default=14)
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="numbers of variables")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    parser.add_argument("--child", nargs=2, metavar=("LOOP", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0

    print(
        f"jax {jax.__version__} on {jax.devices()[0].platform}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs"
    )
    sizes = tuple(args.sizes)
    times, compilations = time_eager(args.rounds, args.calls_per_round, sizes)
    missed = report_eager(times, compilations, sizes)

    print(f"\n{'RSS growth (MiB, fresh process each)':<42}{'statevar':>10}{'pure JAX':>10}")
    for loop, (_, calls) in LOOPS.items():
        ours, theirs = memory_growth(loop, "statevar"), memory_growth(loop, "jax")
        print(f"{f'{calls:,} {loop}':<42}{ours:>10.1f}{theirs:>10.1f}")
        allowed = TARGETS["memory factor"] * max(theirs, 0.0) + RSS_NOISE_MIB
        if ours > allowed:
            missed.append(f"{loop}: {ours:.1f} MiB > {allowed:.1f} MiB allowed")

    print(
        f"\ntargets: eager gradient and update <= {TARGETS['gradient']}x, "
        f"eager step <= {TARGETS['step']}x, "
        f"{TARGETS['compilations']} compilations after warm-up, RSS growth <= "
        f"{TARGETS['memory factor']:g}x pure JAX's + {RSS_NOISE_MIB:g} MiB"
    )
    print("FAIL: " + "; ".join(missed) if missed else "all targets met")
    return 1 if missed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
