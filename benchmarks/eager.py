"""Eager gradients and dropped compiled steps: statevar against the same code in pure JAX.

Measured in one run, printed as ratios to pure JAX:

- **Eager gradient**: `statevar.grad` of an MLP loss (32 -> 64 -> 1, batch 16), called
  eagerly, operation by operation, against eager `jax.grad` of the same pure function.
- **Eager step**: `statevar.grad` then `statevar.Optimizer.apply` (``optax.adam``) against
  `jax.grad` then ``optax`` ``update`` + ``apply_updates``, both eager.
- **Compilations after warm-up**: JAX compilations (``jax.monitoring``'s backend-compile
  events) during the timed calls of each eager variant, after 5 warm-up calls. Pure JAX
  compiles nothing there; neither may statevar.
- **Memory**: the growth of the process's resident set (RSS) over 10,000 eager gradient
  calls, and over 1,000 compiled steps each made (`statevar.jit` / `jax.jit` of a new
  function), called once and dropped. Each loop runs in a fresh Python process (the script
  starts itself with ``--child``), after a warm-up of 5% of its calls, so JAX's own
  one-time caches are not counted.

The eager variants take turns round after round, in a rotating order, each round timing
``--calls-per-round`` calls waited for at the end; the reported time is the median of the
rounds' mean call times. Targets (`TARGETS`): each eager ratio at most 1.5x, no compilation
after warm-up, and each memory growth at most twice pure JAX's plus `RSS_NOISE_MIB` (RSS
counts the whole process: a few MiB of allocator noise either way). ``--check`` exits 1
on a miss.

    python benchmarks/eager.py [--rounds 30] [--calls-per-round 20] [--check]
"""

from __future__ import annotations

import argparse
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

import statevar

IN_FEATURES, HIDDEN, OUT_FEATURES, BATCH = 32, 64, 1, 16
EAGER_CALLS, DROPPED_STEPS = 10_000, 1_000
RSS_NOISE_MIB = 8.0
TARGETS = {"eager ratio": 1.5, "compilations": 0, "memory factor": 2.0}


# ------------------------------------------------------------------------ the workloads


def batch() -> tuple[jax.Array, jax.Array]:
    x = jax.random.normal(jax.random.key(0), (BATCH, IN_FEATURES))
    return x, jnp.sin(x.sum(axis=1, keepdims=True))


def initial_parameters() -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(jax.random.key(1))
    return {
        "w1": jax.random.normal(k1, (IN_FEATURES, HIDDEN)) * 0.1,
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(k2, (HIDDEN, OUT_FEATURES)) * 0.1,
        "b2": jnp.zeros(OUT_FEATURES),
    }


def mlp_loss(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    """The same loss for both: pure JAX passes arrays, statevar its Variables."""
    hidden = jax.nn.relu(x @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] + params["b2"] - y) ** 2)


class MLP(statevar.Module):
    def __init__(self) -> None:
        for name, value in initial_parameters().items():
            setattr(self, name, statevar.Variable(value, name=name))

    def loss(self, x: jax.Array, y: jax.Array) -> jax.Array:
        return mlp_loss({"w1": self.w1, "b1": self.b1, "w2": self.w2, "b2": self.b2}, x, y)


def eager_variants() -> dict[str, Callable[[], Any]]:
    """Each variant: a function running one eager call, returning what it computed."""
    x, y = batch()
    model, stepped = MLP(), MLP()
    grad = statevar.grad(model.loss, model)
    optimizer = statevar.Optimizer(optax.adam(1e-3), stepped)
    step_grad = statevar.grad(stepped.loss, stepped)

    def statevar_step() -> Any:
        optimizer.apply(step_grad(x, y))
        return stepped.w1.value

    params = initial_parameters()
    jax_grad = jax.grad(mlp_loss)
    tx = optax.adam(1e-3)
    state = {"params": initial_parameters()}
    state["opt"] = tx.init(state["params"])

    def jax_step() -> Any:
        grads = jax_grad(state["params"], x, y)
        updates, state["opt"] = tx.update(grads, state["opt"], state["params"])
        state["params"] = optax.apply_updates(state["params"], updates)
        return state["params"]["w1"]

    return {
        "gradient: statevar.grad": lambda: grad(x, y),
        "gradient: jax.grad": lambda: jax_grad(params, x, y),
        "step: statevar.grad + Optimizer.apply": statevar_step,
        "step: jax.grad + optax": jax_step,
    }


class CompileCounter:
    """Counts XLA compilations, as ``jax.monitoring`` reports them."""

    def __init__(self) -> None:
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event: str, duration: float, **_: Any) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            self.count += 1


def time_eager(rounds: int, calls: int) -> tuple[dict[str, float], dict[str, int]]:
    """Median seconds per call of each eager variant, and its compilations after warm-up."""
    counter = CompileCounter()
    variants = eager_variants()
    compilations = dict.fromkeys(variants, 0)
    for run in variants.values():
        for _ in range(5):
            jax.block_until_ready(run())
    samples: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            run = variants[name]
            before = counter.count
            start = time.perf_counter()
            for _ in range(calls - 1):
                run()
            jax.block_until_ready(run())
            samples[name].append((time.perf_counter() - start) / calls)
            compilations[name] += counter.count - before
    return {name: statistics.median(s) for name, s in samples.items()}, compilations


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
        model = MLP()
        return lambda: statevar.grad(model.loss, model)(x, y)
    params = initial_parameters()
    return lambda: jax.grad(mlp_loss)(params, x, y)


def dropped_step(variant: str) -> Callable[[], Any]:
    """Makes a new compiled step, calls it once, and drops it."""
    x, y = batch()
    if variant == "statevar":
        model = MLP()

        def run_statevar() -> Any:
            @statevar.jit
            def step(x: jax.Array, y: jax.Array) -> jax.Array:
                loss, grads = statevar.value_and_grad(model.loss, model)(x, y)
                for name, g in grads.items():
                    getattr(model, name).assign_sub(0.01 * g)
                return loss

            return step(x, y)

        return run_statevar
    state = {"params": initial_parameters()}

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls-per-round", type=int, default=20)
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
    times, compilations = time_eager(args.rounds, args.calls_per_round)
    missed = []
    print(f"\n{'eager call':<42}{'ms/call':>9}{'ratio':>8}{'compiles':>10}")
    for kind, ours, theirs in (
        ("gradient", "gradient: statevar.grad", "gradient: jax.grad"),
        ("step", "step: statevar.grad + Optimizer.apply", "step: jax.grad + optax"),
    ):
        ratio = times[ours] / times[theirs]
        for name, shown in ((ours, f"{ratio:.2f}x"), (theirs, "1.00x")):
            print(f"{name:<42}{times[name] * 1e3:>9.3f}{shown:>8}{compilations[name]:>10}")
        if ratio > TARGETS["eager ratio"]:
            missed.append(f"eager {kind} {ratio:.2f}x > {TARGETS['eager ratio']}x")
        if compilations[ours] > TARGETS["compilations"]:
            missed.append(f"eager {kind}: {compilations[ours]} compilations after warm-up")

    print(f"\n{'RSS growth (MiB, fresh process each)':<42}{'statevar':>10}{'pure JAX':>10}")
    for loop, (_, calls) in LOOPS.items():
        ours, theirs = memory_growth(loop, "statevar"), memory_growth(loop, "jax")
        print(f"{f'{calls:,} {loop}':<42}{ours:>10.1f}{theirs:>10.1f}")
        allowed = TARGETS["memory factor"] * max(theirs, 0.0) + RSS_NOISE_MIB
        if ours > allowed:
            missed.append(f"{loop}: {ours:.1f} MiB > {allowed:.1f} MiB allowed")

    print(
        f"\ntargets: eager ratios <= {TARGETS['eager ratio']}x, "
        f"{TARGETS['compilations']} compilations after warm-up, RSS growth <= "
        f"{TARGETS['memory factor']:g}x pure JAX's + {RSS_NOISE_MIB:g} MiB"
    )
    print("FAIL: " + "; ".join(missed) if missed else "all targets met")
    return 1 if missed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
