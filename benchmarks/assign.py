"""Benchmark: ``v.assign_add(d)`` against a raw donated ``jax.jit`` and a plain ``x = x + d``.

Prints, from one run:

(a) the per-call time of an f32[4] update (mostly dispatch overhead), median over many
    samples, both pipelined and with each call waited for;
(b) the per-update time and the peak memory growth of 20 updates of an f32[64Mi]
    (256 MiB) array, each variant in fresh processes;

each beside the raw donated jit, as ratios, and checks them against statevar's targets.
See benchmarks/README.md for how memory is measured.

    python benchmarks/assign.py            # prints the tables
    python benchmarks/assign.py --check    # also exits with status 1 if a target is missed

With ``--gib N`` it measures instead (c): the bandwidth of ``v.assign_add(1.0)`` on an N GiB
f32 variable against a device-to-device copy of the same array, both counting the bytes read
and written (each reads and writes the array once), so an in-place update that streams at
the memory's speed scores 100%.

    python benchmarks/assign.py --gib 1 --check   # the GPU check's mode (tools/gpu_check.sh)
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
from schedule import turns

import statevar

VARIANTS = {
    "statevar": "statevar v.assign_add(d)",
    "donated": "raw jit(donate_argnums=0)",
    "plain": "plain x = x + d",
}
SMALL_TARGET = 1.4  # statevar / raw donated jit, per call
LARGE_TARGET = 1.1  # statevar / raw donated jit, per update
GROWTH_TARGET = 0.10  # statevar's peak memory growth, as a fraction of the variable's size

BANDWIDTH_TARGET = 0.85  # assign_add's bandwidth as a share of a device-to-device copy's
BANDWIDTH_REPEATS = 20

LARGE_SIZE = 64 * 2**20  # elements: f32[64Mi] is 256 MiB
LARGE_UPDATES = 20

_donated_add = jax.jit(lambda x, d: x + d, donate_argnums=0)


# ------------------------------------------------------------------ the variants


def make_update(variant: str, size: int) -> tuple[Callable[[], None], Callable[[], None]]:
    """Returns ``(update, wait)``: one update of a f32[size] state by a delta of ones, and a
    function that blocks until the updates issued so far are done.

    The state is created before the delta, so that creating it (which briefly holds two
    copies for a Variable) is over before the steady state is measured.
    """
    if variant == "statevar":
        variable = statevar.Variable(jnp.zeros(size, jnp.float32))
        delta = jnp.ones(size, jnp.float32)

        def update() -> None:
            variable.assign_add(delta)

        def wait() -> None:
            variable.value.block_until_ready()

        return update, wait

    step = _donated_add if variant == "donated" else (lambda x, d: x + d)
    state = [jnp.zeros(size, jnp.float32)]
    delta = jnp.ones(size, jnp.float32)

    def update() -> None:
        state[0] = step(state[0], delta)

    def wait() -> None:
        state[0].block_until_ready()

    return update, wait


# ------------------------------------------------------------------ (a) small, per call


def time_small(samples: int, calls: int) -> dict[str, float]:
    """Median seconds per f32[4] update; the variants take turns, sample by sample.

    A sample times ``calls`` back-to-back updates and one final wait. With many calls, as a
    training loop issues them, this measures the cost of dispatching an update; with one,
    the round trip of an update that is waited for.
    """
    updates = {variant: make_update(variant, 4) for variant in VARIANTS}
    for update, wait in updates.values():
        for _ in range(calls):
            update()
        wait()
    times: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for order in turns(VARIANTS, samples):
        for variant in order:
            update, wait = updates[variant]
            start = time.perf_counter()
            for _ in range(calls):
                update()
            wait()
            times[variant].append((time.perf_counter() - start) / calls)
    return {variant: statistics.median(values) for variant, values in times.items()}


# ------------------------------------------------------------------ (b) large, in a child


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _settle(read: Callable[[], int]) -> None:
    """Waits until ``read()`` (memory in use) stops changing: until the buffers dropped
    during warm-up are really freed.

    JAX frees a dropped buffer asynchronously, and unmapping 256 MiB takes tens of
    milliseconds; a baseline taken before that would already include the next update's
    growth. glibc may also keep freed memory, which ``malloc_trim`` returns to the OS.
    """
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    last, stable_since, deadline = read(), time.perf_counter(), time.perf_counter() + 2.0
    while time.perf_counter() < deadline and time.perf_counter() - stable_since < 0.05:
        time.sleep(0.005)
        current = read()
        if current != last:
            last, stable_since = current, time.perf_counter()


class PeakResidentGrowth:
    """Peak growth of this process's resident set (RSS) above its level at `start`.

    Resets the kernel's high-water mark (VmHWM) by writing 5 to /proc/self/clear_refs, which
    makes the peak exact. Where that is not allowed, samples VmRSS from a thread every 0.2
    ms instead, which can miss a peak shorter than that.
    """

    def __init__(self) -> None:
        self.method = "VmHWM reset"
        self._sampled_peak = 0
        self._running = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        _settle(lambda: _status_bytes("VmRSS"))
        self.baseline = _status_bytes("VmRSS")
        try:
            with open("/proc/self/clear_refs", "w") as clear_refs:
                clear_refs.write("5")
        except OSError:
            self.method = "VmRSS sampled every 0.2 ms"
            self._sampled_peak = self.baseline
            self._running = True
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()

    def _sample(self) -> None:
        while self._running:
            self._sampled_peak = max(self._sampled_peak, _status_bytes("VmRSS"))
            time.sleep(0.0002)

    def stop(self) -> int:
        if self._thread is None:
            return _status_bytes("VmHWM") - self.baseline
        self._running = False
        self._thread.join()
        return self._sampled_peak - self.baseline


class PeakDeviceGrowth:
    """Peak growth of the allocator's bytes in use on an accelerator above `start`.

    ``peak_bytes_in_use`` cannot be reset, so this reports the process's peak so far minus
    the bytes in use at `start`: an upper bound, exact when setup peaked no higher than the
    steady state (`make_update` arranges that).
    """

    method = "peak_bytes_in_use"

    def __init__(self, device: jax.Device) -> None:
        self.device = device

    def start(self) -> None:
        _settle(lambda: self.device.memory_stats()["bytes_in_use"])
        self.baseline = self.device.memory_stats()["bytes_in_use"]

    def stop(self) -> int:
        return self.device.memory_stats()["peak_bytes_in_use"] - self.baseline


def run_large_child(variant: str) -> dict:
    """Times ``LARGE_UPDATES`` f32[64Mi] updates, each waited for, and measures peak growth."""
    device = jax.devices()[0]
    update, wait = make_update(variant, LARGE_SIZE)
    for _ in range(2):  # compile, and reach the steady state
        update()
        wait()
    uses_device_memory = device.platform != "cpu" and device.memory_stats()
    memory = PeakDeviceGrowth(device) if uses_device_memory else PeakResidentGrowth()
    memory.start()
    times = []
    for _ in range(LARGE_UPDATES):
        start = time.perf_counter()
        update()
        wait()
        times.append(time.perf_counter() - start)
    growth = memory.stop()
    return {"times": times, "growth": growth, "method": memory.method}


def time_large(rounds: int) -> tuple[dict[str, float], dict[str, int], str]:
    """Runs each variant in ``rounds`` fresh processes, taking turns.

    Returns the median seconds per update over all rounds, the largest peak growth seen in
    any round, and how memory was measured.
    """
    times: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    growth: dict[str, int] = {variant: 0 for variant in VARIANTS}
    method = ""
    for order in turns(VARIANTS, rounds):
        for variant in order:
            child = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child", variant],
                capture_output=True,
                text=True,
            )
            if child.returncode != 0:
                sys.exit(f"The {variant} process failed:\n{child.stderr}")
            result = json.loads(child.stdout.strip().splitlines()[-1])
            times[variant].extend(result["times"])
            growth[variant] = max(growth[variant], result["growth"])
            method = result["method"]
    return {v: statistics.median(t) for v, t in times.items()}, growth, method


# ------------------------------------------------------------------ (c) bandwidth


def time_bandwidth(gib: float, repeats: int) -> dict[str, float]:
    """Median seconds of ``v.assign_add(1.0)`` and of ``x.copy()`` on f32 arrays of ``gib``
    GiB, each waited for, taking turns."""
    size = int(gib * 2**30) // 4
    variable = statevar.Variable(jnp.zeros(size, jnp.float32))
    source = jnp.zeros(size, jnp.float32)
    holder: list[jax.Array] = []

    def update() -> None:
        variable.assign_add(1.0)
        variable.value.block_until_ready()

    def copy() -> None:
        holder[:] = [source.copy()]
        holder[0].block_until_ready()

    runs = {"assign_add": update, "copy": copy}
    for run in runs.values():  # compile, and reach the steady state
        run()
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    if float(variable.value[0]) != 2.0 + repeats:
        sys.exit("assign_add did not add: the variable holds a wrong value")
    return {name: statistics.median(values) for name, values in times.items()}


def report_bandwidth(gib: float, repeats: int, check: bool) -> None:
    device = jax.devices()[0]
    print(
        f"statevar {statevar.__version__}, jax {jax.__version__}, device {device} "
        f"({device.device_kind})"
    )
    times = time_bandwidth(gib, repeats)
    moved = 2 * int(gib * 2**30)  # read once, written once
    print(
        f"\n(c) f32 {gib:g} GiB, median of {repeats} runs each, taking turns; bandwidth "
        f"counts the bytes\n    read and written"
    )
    print(f"    {'operation':<28}{'time':>12}{'bandwidth':>14}")
    labels = {"assign_add": "statevar v.assign_add(1.0)", "copy": "device-to-device x.copy()"}
    for name, label in labels.items():
        print(
            f"    {label:<28}{_format_time(times[name]):>12}{moved / times[name] / 1e9:>10.1f} GB/s"
        )
    share = times["copy"] / times["assign_add"]
    passed = share >= BANDWIDTH_TARGET
    print("\nTargets")
    text = f"assign_add bandwidth >= {BANDWIDTH_TARGET:.0%} of a copy's"
    print(f"    [{'PASS' if passed else 'MISS'}] {text:<52} measured {share:.1%}")
    if check and not passed:
        sys.exit(1)


# ------------------------------------------------------------------ report


def _format_time(seconds: float) -> str:
    return f"{seconds * 1e6:8.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:8.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300, help="samples of the small update")
    parser.add_argument("--calls", type=int, default=50, help="updates per small sample")
    parser.add_argument("--rounds", type=int, default=5, help="processes per large variant")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    parser.add_argument("--gib", type=float, help="measure (c), the bandwidth on N GiB, alone")
    parser.add_argument("--child", choices=list(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_large_child(args.child)))
        return
    if args.gib:
        report_bandwidth(args.gib, BANDWIDTH_REPEATS, args.check)
        return

    device = jax.devices()[0]
    print(
        f"statevar {statevar.__version__}, jax {jax.__version__}, device {device} "
        f"({device.device_kind}), {os.cpu_count()} CPU cores"
    )

    pipelined = time_small(args.samples, args.calls)
    waited = time_small(args.samples * 10, 1)
    print(
        f"\n(a) f32[4] update, median time per call, variants interleaved. pipelined: "
        f"{args.samples} samples of\n    {args.calls} calls then one wait (as a loop issues "
        f"them); waited: {args.samples * 10} single calls, each waited for"
    )
    print(f"    {'variant':<28}{'pipelined':>11}{'ratio':>8}{'waited':>14}{'ratio':>8}")
    for variant, label in VARIANTS.items():
        print(
            f"    {label:<28}{_format_time(pipelined[variant]):>11}"
            f"{pipelined[variant] / pipelined['donated']:>7.2f}x"
            f"{_format_time(waited[variant]):>14}{waited[variant] / waited['donated']:>7.2f}x"
        )

    large, growth, method = time_large(args.rounds)
    size_bytes = LARGE_SIZE * 4
    print(
        f"\n(b) f32[64Mi] (256 MiB) update, {LARGE_UPDATES} updates (each waited for) in each "
        f"of {args.rounds} fresh processes\n    per variant, interleaved: median time per "
        f"update; largest peak memory growth over the\n    {LARGE_UPDATES} updates ({method})"
    )
    print(f"    {'variant':<28}{'time/update':>12}{'ratio':>8}{'peak growth':>22}")
    for variant, label in VARIANTS.items():
        ratio = large[variant] / large["donated"]
        mib = growth[variant] / 2**20
        share = growth[variant] / size_bytes
        print(
            f"    {label:<28}{_format_time(large[variant]):>12}{ratio:>7.2f}x"
            f"{mib:>13.1f} MiB ({share:>4.0%})"
        )

    checks = [
        (
            f"f32[4] pipelined: statevar <= {SMALL_TARGET}x donated jit",
            pipelined["statevar"] / pipelined["donated"],
            SMALL_TARGET,
            "x",
        ),
        (
            f"f32[4] waited:    statevar <= {SMALL_TARGET}x donated jit",
            waited["statevar"] / waited["donated"],
            SMALL_TARGET,
            "x",
        ),
        (
            f"f32[64Mi] update: statevar <= {LARGE_TARGET}x donated jit",
            large["statevar"] / large["donated"],
            LARGE_TARGET,
            "x",
        ),
        (
            f"f32[64Mi] peak growth: statevar <= {GROWTH_TARGET:.0%} of 256 MiB",
            growth["statevar"] / size_bytes,
            GROWTH_TARGET,
            "%",
        ),
    ]
    print("\nTargets")
    missed = 0
    for text, value, target, unit in checks:
        passed = value <= target
        missed += not passed
        shown = f"{value:.2f}x" if unit == "x" else f"{value:.1%}"
        print(f"    [{'PASS' if passed else 'MISS'}] {text:<52} measured {shown}")
    if args.check and missed:
        sys.exit(1)


if __name__ == "__main__":
    main()
