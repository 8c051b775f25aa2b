"""Checkpoints in a training loop: no save, a blocking save and a save in the background,
statevar against orbax on plain JAX with the same arrays.

A training loop (an MLP of square layers, adam) saves its whole state (parameters and
optimizer state) every N steps. Six variants, each in its own fresh Python process (the
script starts itself with ``--child VARIANT``), several processes per variant, taking turns:

- statevar: a `statevar.jit` step; no save, `CheckpointManager.save`, and
  `CheckpointManager(async_save=True).save`.
- plain JAX: a `jax.jit` step donating parameters and optimizer state; no save, and orbax's
  own ``CheckpointManager`` with ``enable_async_checkpointing`` False and True.

Each process compiles the step and makes one save of its kind (warm-up), then times a loop
of ``saves x N`` steps that saves at steps 0, N, 2N, ... and waits for the last save at the
end. Before each save the loop waits for its step (as a loop reading its loss would), so
that the save call's time is the save's alone. It reports the time per step, the median
time a save call blocked, and the peak memory growth over the loop (on the CPU the resident
set, on a GPU the allocator's bytes in use, measured as `assign.py` measures them).

N comes from a calibration process: twice the time of one blocking save over the time of
one step, so that each write is shorter than the interval between saves. Targets: the loop
saving in the background within 1.1x of the loop that never saves; and the device memory
of a save in the background at most one extra copy of the saved arrays (plus 1%) above
that loop's: on a GPU the allocator's peak; on the CPU, which keeps no allocator
statistics, the peak bytes of live JAX arrays between steps (the resident set is printed
too, but it also holds the buffers of orbax's write, which any save has).

    python benchmarks/checkpoint.py            # about 3 minutes on 2 CPU cores
    python benchmarks/checkpoint.py --check    # also exits with status 1 if a target is missed
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from assign import PeakDeviceGrowth, PeakResidentGrowth  # noqa: E402
from schedule import turns  # noqa: E402

import statevar  # noqa: E402

VARIANTS = {
    "statevar-none": "statevar, no save",
    "statevar-sync": "statevar, save",
    "statevar-async": "statevar, async save",
    "jax-none": "jax.jit, no save",
    "jax-sync": "jax.jit + orbax, save",
    "jax-async": "jax.jit + orbax, async save",
}
TIME_TARGET = 1.1  # the async-saving loop / the loop that never saves
COPIES_TARGET = 1.0  # extra device memory of the async-saving loop, in copies of the state
COPIES_TOLERANCE = 0.01  # what else a loop holds: losses, step counts, allocator rounding
LEARNING_RATE = 1e-3


def _shape(args: argparse.Namespace) -> tuple[int, int, int]:
    """(layers, width, batch), by platform unless given."""
    on_cpu = jax.devices()[0].platform == "cpu"
    width = args.width or (1024 if on_cpu else 4096)
    return args.layers, width, args.batch or (256 if on_cpu else 4096)


def _initial(layers: int, width: int, batch: int) -> tuple[list[np.ndarray], np.ndarray]:
    """The same parameters and batch for every variant."""
    rng = np.random.default_rng(0)
    scale = 1.0 / math.sqrt(width)
    kernels = [rng.standard_normal((width, width), np.float32) * scale for _ in range(layers)]
    return kernels, rng.standard_normal((batch, width), np.float32)


def _loss(kernels: list[jax.Array], x: jax.Array) -> jax.Array:
    h = x
    for kernel in kernels:
        h = jnp.tanh(h @ kernel)
    return jnp.mean((h - x) ** 2)


# ------------------------------------------------------------------ the loops


class StatevarLoop:
    """A `statevar.jit` step over Variables; saves with a `statevar.CheckpointManager`."""

    def __init__(self, kernels: list[np.ndarray], x: np.ndarray, directory: str, save: str):
        self.kernels = [statevar.Variable(k, name=f"kernel{i}") for i, k in enumerate(kernels)]
        self.optimizer = statevar.Optimizer(optax.adam(LEARNING_RATE), self.kernels)
        self.x = jnp.asarray(x)
        grad = statevar.value_and_grad(
            lambda: _loss([k.value for k in self.kernels], self.x), self.kernels
        )
        self.manager = None
        if save != "none":
            self.manager = statevar.CheckpointManager(
                directory, max_to_keep=2, async_save=save == "async"
            )

        @statevar.jit
        def step() -> jax.Array:
            loss, grads = grad()
            self.optimizer.apply(grads)
            return loss

        self.step = step

    def save(self, step: int) -> None:
        assert self.manager is not None
        self.manager.save(step, [self.kernels, self.optimizer])

    def ready(self) -> None:
        self.optimizer.iterations.value.block_until_ready()

    def finish(self) -> None:
        self.kernels[0].value.block_until_ready()
        if self.manager is not None:
            self.manager.wait_until_finished()

    def state_bytes(self) -> int:
        variables = self.kernels + list(self.optimizer.state_variables)
        return sum(v.value.nbytes for v in variables)


class JaxLoop:
    """A `jax.jit` step donating parameters and optimizer state; saves with orbax's own
    ``CheckpointManager``, the way a plain-JAX program checkpoints."""

    def __init__(self, kernels: list[np.ndarray], x: np.ndarray, directory: str, save: str):
        import orbax.checkpoint as ocp

        self.ocp = ocp
        tx = optax.adam(LEARNING_RATE)
        self.params = [jnp.asarray(k) for k in kernels]
        self.opt_state = tx.init(self.params)
        self.x = jnp.asarray(x)
        self.manager = None
        if save != "none":
            options = ocp.CheckpointManagerOptions(
                max_to_keep=2, enable_async_checkpointing=save == "async", create=True
            )
            self.manager = ocp.CheckpointManager(directory, options=options, item_names=("s",))

        def step(params: Any, opt_state: Any, x: jax.Array) -> Any:
            loss, grads = jax.value_and_grad(_loss)(params, x)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        self._step = jax.jit(step, donate_argnums=(0, 1))

    def step(self) -> jax.Array:
        self.params, self.opt_state, loss = self._step(self.params, self.opt_state, self.x)
        return loss

    def save(self, step: int) -> None:
        assert self.manager is not None
        state = {"params": self.params, "opt_state": self.opt_state}
        args = self.ocp.args.Composite(s=self.ocp.args.StandardSave(state))
        self.manager.save(step, args=args)

    def ready(self) -> None:
        jax.block_until_ready((self.params, self.opt_state))

    def finish(self) -> None:
        self.params[0].block_until_ready()
        if self.manager is not None:
            self.manager.wait_until_finished()

    def state_bytes(self) -> int:
        leaves = jax.tree.leaves((self.params, self.opt_state))
        return sum(leaf.nbytes for leaf in leaves)


def _make_loop(variant: str, args: argparse.Namespace, directory: str) -> Any:
    library, save = variant.split("-")
    kernels, x = _initial(*_shape(args))
    loop_type = StatevarLoop if library == "statevar" else JaxLoop
    return loop_type(kernels, x, directory, save)


# ------------------------------------------------------------------ children


class LiveArrayGrowth:
    """Peak growth of the bytes held by live JAX arrays above `start`, sampled after every
    step and save call: on the CPU, where the allocator keeps no statistics, the device
    memory the loop holds between steps (a copy a save holds shows; a step's temporaries,
    the same in every variant, do not)."""

    def start(self) -> None:
        self.baseline = self.peak = self._bytes()

    def sample(self) -> None:
        self.peak = max(self.peak, self._bytes())

    def stop(self) -> int:
        return self.peak - self.baseline

    @staticmethod
    def _bytes() -> int:
        # Several Array objects can share one buffer (a one-device array and its shard, as
        # orbax reads it): count each buffer once.
        buffers = {}
        for array in jax.live_arrays():
            if array.is_deleted():
                continue
            if len(array.sharding.device_set) == 1:
                buffers[array.unsafe_buffer_pointer()] = array.nbytes
            else:
                buffers[id(array)] = array.nbytes
        return sum(buffers.values())


def run_child(variant: str, args: argparse.Namespace) -> dict:
    """Warms up, then times ``args.saves`` intervals of ``args.every`` steps, saving at the
    start of each, and measures the peak memory growth over them."""
    directory = tempfile.mkdtemp(prefix="statevar-checkpoint-benchmark-")
    try:
        loop = _make_loop(variant, args, directory)
        saving = not variant.endswith("none")
        for _ in range(2):  # compile, reach the steady state
            loop.step()
        if saving:
            loop.save(0)
        loop.step()
        loop.finish()
        device = jax.devices()[0]
        uses_device_memory = device.platform != "cpu" and device.memory_stats()
        memory = PeakDeviceGrowth(device) if uses_device_memory else PeakResidentGrowth()
        live = LiveArrayGrowth()
        memory.start()
        live.start()
        save_calls = []
        start = time.perf_counter()
        for step in range(args.saves * args.every):
            if saving and step % args.every == 0:
                loop.ready()  # as a loop reading its loss: the save call times the save alone
                called = time.perf_counter()
                loop.save(step + 1)
                save_calls.append(time.perf_counter() - called)
                live.sample()
            loop.step()
            live.sample()
        loop.finish()
        elapsed = time.perf_counter() - start
        return {
            "step": elapsed / (args.saves * args.every),
            "save_call": statistics.median(save_calls) if save_calls else 0.0,
            "growth": memory.stop(),
            "arrays": live.stop(),
            "method": memory.method,
            "state_bytes": loop.state_bytes(),
        }
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def calibrate(args: argparse.Namespace) -> dict:
    """Times one step and one blocking statevar save of the state (medians of 5 and 3)."""
    directory = tempfile.mkdtemp(prefix="statevar-checkpoint-benchmark-")
    try:
        loop = _make_loop("statevar-sync", args, directory)
        steps, saves = [], []
        for _ in range(7):
            start = time.perf_counter()
            loop.step().block_until_ready()
            steps.append(time.perf_counter() - start)
        for step in range(4):
            start = time.perf_counter()
            loop.save(step)
            saves.append(time.perf_counter() - start)
        return {"step": statistics.median(steps[2:]), "save": statistics.median(saves[1:])}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _child(mode: str, args: argparse.Namespace) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--child", mode]
    for option in ("layers", "width", "batch", "every", "saves"):
        if getattr(args, option) is not None:
            command += [f"--{option}", str(getattr(args, option))]
    child = subprocess.run(command, capture_output=True, text=True)
    if child.returncode != 0:
        sys.exit(f"The {mode} process failed:\n{child.stderr}")
    return json.loads(child.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ report


def _format_time(seconds: float) -> str:
    return f"{seconds * 1e3:8.2f} ms" if seconds < 1 else f"{seconds:8.2f} s "


def _report(results: dict[str, list[dict]], args: argparse.Namespace) -> bool:
    """Prints the table and the targets; returns whether every target is met."""
    step = {v: statistics.median(r["step"] for r in rs) for v, rs in results.items()}
    call = {v: statistics.median(r["save_call"] for r in rs) for v, rs in results.items()}
    growth = {v: max(r["growth"] for r in rs) for v, rs in results.items()}
    arrays = {v: max(r["arrays"] for r in rs) for v, rs in results.items()}
    state_bytes = results["statevar-none"][0]["state_bytes"]
    method = results["statevar-none"][0]["method"]
    on_gpu = method == "peak_bytes_in_use"
    print(
        f"\nloops of {args.saves} x {args.every} steps, {args.rounds} fresh processes per "
        "variant, interleaved: median time per step,\nmedian time a save call blocked, "
        f"largest peak memory growth over the loop ({method}) and of the bytes\nof live "
        "JAX arrays between steps"
    )
    header = f"    {'variant':<28}{'time/step':>11}{'vs no save':>12}{'vs plain JAX':>14}"
    print(header + f"{'save call':>12}{'peak growth':>14}{'live arrays':>14}")
    for variant, label in VARIANTS.items():
        library, save = variant.split("-")
        versus_none = step[variant] / step[f"{library}-none"]
        versus_jax = step[variant] / step[f"jax-{save}"]
        shown_call = _format_time(call[variant]) if save != "none" else "-"
        print(
            f"    {label:<28}{_format_time(step[variant]):>11}{versus_none:>11.2f}x"
            f"{versus_jax:>13.2f}x{shown_call:>12}{growth[variant] / 2**20:>10.1f} MiB"
            f"{arrays[variant] / 2**20:>10.1f} MiB"
        )
    # Device memory: the allocator's on a GPU; on the CPU, where orbax's write buffers share
    # the resident set, the live arrays between steps.
    device = growth if on_gpu else arrays
    print(
        f"\n    extra device memory over the loop that never saves, in copies of the saved "
        f"state ({state_bytes / 2**20:.1f} MiB)\n    {'':<28}{'save':>10}{'async save':>12}"
    )
    for library, label in (("statevar", "statevar"), ("jax", "jax.jit + orbax")):
        extra = [(device[f"{library}-{s}"] - device[f"{library}-none"]) for s in ("sync", "async")]
        print(f"    {label:<28}{extra[0] / state_bytes:>10.2f}{extra[1] / state_bytes:>12.2f}")
    time_ratio = step["statevar-async"] / step["statevar-none"]
    added = device["statevar-async"] - device["statevar-none"]
    checks = [
        (
            f"async save loop <= {TIME_TARGET}x the loop that never saves",
            f"{time_ratio:.2f}x",
            time_ratio <= TIME_TARGET,
        ),
        (
            "async save: <= one extra copy of the saved arrays in device memory",
            f"{added / state_bytes:.2f} copies",
            added <= (COPIES_TARGET + COPIES_TOLERANCE) * state_bytes,
        ),
    ]
    print("\nTargets")
    for text, shown, passed in checks:
        print(f"    [{'PASS' if passed else 'MISS'}] {text:<66} measured {shown}")
    return all(passed for _, _, passed in checks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4, help="square layers of the MLP")
    parser.add_argument("--width", type=int, help="layer width (1024 on CPU, 4096 on GPU)")
    parser.add_argument("--batch", type=int, help="batch size (256 on CPU, 4096 on GPU)")
    parser.add_argument("--every", type=int, help="steps between saves (default: calibrated)")
    parser.add_argument("--saves", type=int, default=3, help="saves per timed loop")
    parser.add_argument("--rounds", type=int, default=3, help="processes per variant")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "calibrate":
        print(json.dumps(calibrate(args)))
        return
    if args.child:
        print(json.dumps(run_child(args.child, args)))
        return

    import orbax.checkpoint as ocp

    device = jax.devices()[0]
    layers, width, batch = _shape(args)
    print(
        f"statevar {statevar.__version__}, jax {jax.__version__}, orbax-checkpoint "
        f"{ocp.__version__}, device {device} ({device.device_kind}), {os.cpu_count()} CPU cores"
    )
    print(f"model: {layers} layers f32[{width},{width}], adam, batch {batch}")
    timing = _child("calibrate", args)
    if args.every is None:
        args.every = max(2, math.ceil(2 * timing["save"] / timing["step"]))
    interval = args.every * timing["step"]
    print(
        f"one step {_format_time(timing['step']).strip()}, one blocking save "
        f"{_format_time(timing['save']).strip()}: saving every {args.every} steps (an "
        f"interval of {_format_time(interval).strip()}, {interval / timing['save']:.1f}x "
        "the write)"
    )
    results: dict[str, list[dict]] = {variant: [] for variant in VARIANTS}
    for order in turns(VARIANTS, args.rounds):
        for variant in order:
            results[variant].append(_child(variant, args))
    if not _report(results, args) and args.check:
        sys.exit(1)


if __name__ == "__main__":
    main()
