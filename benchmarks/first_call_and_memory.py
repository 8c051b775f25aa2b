"""First-call time and peak memory of a training step: statevar.jit against pure jax.jit.

Everything here is measured in fresh Python processes (the script starts itself with
``--child CASE VARIANT``), the variants taking turns, so that no cache of JAX, XLA or
statevar carries over from one measurement to the next:

- First call (trace + compile + the first run, waited for) of the transformer step of
  `train_step.py` (2 blocks, d_model 128, sequence 64, batch 8, adam), and of a step
  updating 10,000 variables of shape f32[4] (the per-variable work of tracing dominates).
  Model creation is not timed. Target: statevar at most 1.15x pure `jax.jit` (medians).
  Beside the 10,000-variable case, and not a target: the same pure step with its
  parameters placed by ``jax.device_put`` (committed to the device, as the array of a
  Variable given a device is, which gives every input of the compiled step a sharding
  annotation to compile; the benchmark's variables are placed nowhere, uncommitted).
- Peak memory of a step that returns ``(loss, grads)``, with adam over 768 MiB of state
  (four f32[16Mi] parameters and their two moments): the growth of the process's resident
  set above its level before the step, over 3 steps after one warm-up step (the largest
  over the processes); also, from the compiled step, its ``copy`` instructions, XLA's
  scratch memory and the size of the outputs that take no donated buffer. Target:
  statevar's peak no higher than pure JAX's, within 1% of the state's size (RSS counts the
  whole process, so a few MiB of noise are possible).

    python benchmarks/first_call_and_memory.py [--processes 5]
"""

from __future__ import annotations

import argparse
import functools
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_step  # noqa: E402  (the same models as the per-step benchmark)
from assign import PeakResidentGrowth  # noqa: E402
from schedule import turns  # noqa: E402

import statevar  # noqa: E402

VARIANTS = ("statevar.jit", "jax.jit (donated)")
# Pure JAX with its parameters placed by jax.device_put, committed to the device as the
# array of a Variable given a device is: shown beside the 10,000-variable first call, not a
# target.
PLACED = "jax.jit, device_put"
MANY_VARIABLES = 10_000
LARGE_PARAMETERS, LARGE_SIZE = 4, 16 * 2**20  # 4 x 64 MiB parameters, 768 MiB with adam
MEMORY_STEPS = 3
TARGETS = {"first call": 1.15, "peak memory tolerance": 0.01}


# ----------------------------------------------------------------------------- steps


def many_step(variant: str) -> Callable[[], Any]:
    """An update-only step over `MANY_VARIABLES` f32[4] variables, ready for its first call.

    Each variable becomes ``0.9 * v + x``: the step's work is trivial, so tracing and
    compiling its many inputs and outputs is what the first call costs.
    """
    vectors = list(jax.random.normal(jax.random.key(2), (MANY_VARIABLES, 4)))
    x = jax.random.normal(jax.random.key(3), (4,))
    if variant == "statevar.jit":
        variables = [statevar.Variable(v) for v in vectors]
        del vectors

        @statevar.jit
        def step(x: jax.Array) -> jax.Array:
            for v in variables:
                v.assign(0.9 * v.value + x)
            return x.sum()

        return lambda: step(x)

    @functools.partial(jax.jit, donate_argnums=0)
    def pure_step(params, x):
        return [0.9 * p + x for p in params], x.sum()

    if variant == PLACED:
        vectors = jax.device_put(vectors, jax.devices()[0])
    state = [vectors]
    del vectors

    def run() -> jax.Array:
        state[0], total = pure_step(state[0], x)
        return total

    return run


def transformer_step(variant: str) -> Callable[[], Any]:
    x, y = train_step.transformer_batch()
    if variant == "statevar.jit":
        step = train_step.statevar_transformer_step()
    else:
        step = train_step.jax_transformer_step()
    return lambda: step(x, y)


def large_grads_step(variant: str) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """A step returning ``(loss, grads)`` with adam over 768 MiB of state: (run, compiled),
    ``compiled`` giving the step's compiled executable."""
    tx = optax.adam(1e-3)
    keys = jax.random.split(jax.random.key(6), LARGE_PARAMETERS)
    params = [jax.random.normal(key, (LARGE_SIZE,)) * 0.01 for key in keys]
    x = jnp.float32(0.5)

    def loss_fn(params: list, x: jax.Array) -> jax.Array:
        return sum(jnp.mean((p * x - 1.0) ** 2) for p in params)

    if variant == "statevar.jit":
        variables = [statevar.Variable(p) for p in params]
        del params
        optimizer = statevar.Optimizer(tx, variables)
        loss_and_grads = statevar.value_and_grad(
            lambda x: loss_fn([v.value for v in variables], x), variables
        )

        @statevar.jit
        def step(x: jax.Array) -> tuple[jax.Array, list]:
            loss, grads = loss_and_grads(x)
            optimizer.apply(grads)
            return loss, grads

        def hlo() -> str:
            entry = next(iter(step._cache.entries.values()))
            arrays = [v._value for v in entry.lifted]
            return entry.jitted.lower(arrays, (x,)).compile()

        return lambda: step(x), hlo

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def pure_step(params, opt_state, x):
        loss, grads = jax.value_and_grad(loss_fn)(params, x)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, grads

    state = [params, tx.init(params)]
    del params

    def run() -> tuple[jax.Array, list]:
        state[0], state[1], loss, grads = pure_step(state[0], state[1], x)
        return loss, grads

    def hlo() -> str:
        return pure_step.lower(state[0], state[1], x).compile()

    return run, hlo


# ----------------------------------------------------------------------------- children


def run_child(case: str, variant: str) -> dict:
    if case in ("transformer", "many"):
        run = transformer_step(variant) if case == "transformer" else many_step(variant)
        start = time.perf_counter()
        jax.block_until_ready(run())
        return {"seconds": time.perf_counter() - start}
    run, hlo = large_grads_step(variant)
    jax.block_until_ready(run())  # compile, reach the steady state
    memory = PeakResidentGrowth()
    memory.start()
    for _ in range(MEMORY_STEPS):
        result = run()
        jax.block_until_ready(result)
        del result  # as a training loop drops a step's gradients before the next
    growth = memory.stop()
    compiled = hlo()
    analysis = compiled.memory_analysis()
    return {
        "growth": growth,
        "copies": compiled.as_text().count(" copy("),
        # What XLA allocates beyond the donated inputs it writes over: scratch, and the
        # outputs that alias no input (the gradients, the loss).
        "temp": analysis.temp_size_in_bytes,
        "unaliased_outputs": analysis.output_size_in_bytes - analysis.alias_size_in_bytes,
        "method": memory.method,
    }


def in_fresh_processes(
    case: str, processes: int, variants: tuple[str, ...] = VARIANTS
) -> dict[str, list[dict]]:
    """Runs ``case`` for each variant in ``processes`` fresh processes each, taking turns."""
    results: dict[str, list[dict]] = {variant: [] for variant in variants}
    for order in turns(variants, processes):
        for variant in order:
            child = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child", case, variant],
                capture_output=True,
                text=True,
            )
            if child.returncode != 0:
                sys.exit(f"The {case} {variant} process failed:\n{child.stderr}")
            results[variant].append(json.loads(child.stdout.strip().splitlines()[-1]))
    return results


# ----------------------------------------------------------------------------- report


def report_first_call(title: str, results: dict[str, list[dict]]) -> bool:
    medians = {v: statistics.median(r["seconds"] for r in runs) for v, runs in results.items()}
    baseline = medians["jax.jit (donated)"]
    print(f"\n{title}")
    print(f"  {'variant':<22}{'median s':>10}{'vs jax.jit':>12}   every process (s)")
    for variant, runs in results.items():
        every = " ".join(f"{r['seconds']:.2f}" for r in runs)
        print(
            f"  {variant:<22}{medians[variant]:>10.2f}{medians[variant] / baseline:>11.2f}x"
            f"   {every}"
        )
    ratio = medians["statevar.jit"] / baseline
    passed = ratio <= TARGETS["first call"]
    print(
        f"  target statevar.jit <= {TARGETS['first call']:.2f}x jax.jit (medians): "
        f"{ratio:.3f}x {'PASS' if passed else 'FAIL'}"
    )
    return passed


def report_memory(results: dict[str, list[dict]]) -> bool:
    peaks = {v: max(r["growth"] for r in runs) for v, runs in results.items()}
    baseline = peaks["jax.jit (donated)"]
    mib = 2**20
    state = 3 * LARGE_PARAMETERS * LARGE_SIZE * 4 / mib
    print(
        f"\nstep returning (loss, grads), adam, {state:.0f} MiB of state: largest peak growth "
        f"over {MEMORY_STEPS} steps ({results['statevar.jit'][0]['method']}), copies in HLO"
    )
    print(
        f"  {'variant':<22}{'peak growth':>14}{'vs jax.jit':>12}{'copies':>8}"
        f"{'XLA temp':>12}{'new outputs':>14}"
    )
    for variant, runs in results.items():
        print(
            f"  {variant:<22}{peaks[variant] / mib:>10.1f} MiB{peaks[variant] / baseline:>11.2f}x"
            f"{runs[0]['copies']:>8}{runs[0]['temp'] / mib:>8.1f} MiB"
            f"{runs[0]['unaliased_outputs'] / mib:>10.1f} MiB"
        )
    ratio = peaks["statevar.jit"] / baseline
    excess = (peaks["statevar.jit"] - baseline) / mib
    tolerance = state * TARGETS["peak memory tolerance"]
    passed = excess <= tolerance
    print(
        f"  target statevar.jit peak <= jax.jit's (within 1% of the state, {tolerance:.1f} "
        f"MiB): {ratio:.3f}x, {excess:+.1f} MiB {'PASS' if passed else 'FAIL'}"
    )
    return passed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=5, help="fresh processes per variant")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(*args.child)))
        return
    print(
        f"jax {jax.__version__}, {jax.devices()[0].platform}, {platform.python_version()}, "
        f"{os.cpu_count()} CPU cores; {args.processes} fresh processes per variant, interleaved"
    )
    results = [
        report_first_call(
            "first call, transformer step (2 blocks, d_model 128, sequence 64, batch 8, adam)",
            in_fresh_processes("transformer", args.processes),
        ),
        report_first_call(
            f"first call, update-only step over {MANY_VARIABLES:,} variables f32[4]",
            in_fresh_processes("many", args.processes, (*VARIANTS, PLACED)),
        ),
        report_memory(in_fresh_processes("memory", args.processes)),
    ]
    print(f"\n{'PASS' if all(results) else 'FAIL'}: {sum(results)} of {len(results)} targets met")


if __name__ == "__main__":
    main()
