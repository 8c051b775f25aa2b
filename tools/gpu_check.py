"""The GPU check, in one command: ``tools/gpu_check.sh`` (which runs this file).

On a machine with one GPU whose Python already has jax, flax, optax, orbax-checkpoint, chex
and pytest (no package registry needed), it runs statevar from this checkout, installing
nothing, and writes one report, ``gpu_check.txt``, with a log per step beside it:

1. ``environment``: the versions and devices, and that ``statevar`` is this checkout's.
2. ``gpu-tests``: the GPU-marked tests, and the placement and donation tests, on the GPU
   (the default device there).
3. ``cpu-suite``: the whole test suite on the same JAX with ``JAX_PLATFORMS=cpu``, where the
   multi-device tests get their virtual CPU devices. Tests that need a tool this Python
   lacks (keras, pyright, mkdocs) are left out by name, and the report lists them.
4. ``bandwidth``: ``benchmarks/assign.py --gib 1 --check``, ``assign_add`` against a
   device-to-device copy (target: 85% of the copy's bandwidth).
5. ``memory-report``: a compiled step's ``memory_report`` (its variables' fates, XLA's
   temporaries) beside what the device's allocator sees a call use, on a temporary of the
   bandwidth step's size (where the device counts its memory: the CPU's does not, and the
   test suite checks the CPU's figures against the process's resident memory).

``--cpu-only`` runs the steps on the CPU and skips the GPU-marked tests: the path the test
suite runs (with ``--tests`` and ``--gib`` kept small). The exit status is 0 only when every
step that ran passed and, without ``--cpu-only``, a GPU was found.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What the suite needs beyond the GPU machine's packages, and the tests that need it.
OPTIONAL_TOOLS = {
    "keras": [
        "tests/test_docs.py::test_doc_page_runs[interop.md]",
        "tests/test_docs.py::test_doc_page_runs[migrating.md]",
    ],
    "pyright": ["tests/test_types.py"],
    "mkdocs": ["tests/test_docs_site.py"],
    "matplotlib": ["tests/test_examples.py"],
}
PLACEMENT_AND_DONATION_TESTS = [
    "tests/test_gpu.py",
    "tests/test_placement.py",
    "tests/test_update.py",
]

ENVIRONMENT = """
import importlib.metadata as metadata, jax, statevar
for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "chex", "pytest"):
    try:
        print(f"{name} {metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(f"{name} missing")
print("statevar", statevar.__version__, "from", statevar.__file__)
print("devices", jax.devices())
assert statevar.__file__.startswith(sys.argv[1]), "statevar is not this checkout's"
"""


MEMORY_REPORT = """
import sys
import jax, jax.numpy as jnp
from jax import lax
import statevar

size = int(float(sys.argv[1]) * 2**30) // 4  # the temporary's elements
weights = statevar.Variable(jnp.zeros(1024), name="weights")  # assigned: donated
scale = statevar.Variable(jnp.ones(1024), name="scale")  # only read
total = statevar.Variable(0.0, name="total")

@statevar.jit
def step(x):
    values = lax.optimization_barrier(jnp.sin(jnp.arange(size, dtype=jnp.float32) * x))
    weights.assign(weights * scale + x)
    total.assign_add(values.sum())

report = step.memory_report(1.0)
print(report)
fates = {row.path: row.fate for row in report.variables}
assert fates == {"weights": "donated", "scale": "read", "total": "donated"}, fates
assert size * 4 <= report.temp_bytes <= 1.2 * size * 4 + 2**20, report.temp_bytes
device = jax.devices()[0]
stats = device.memory_stats()
if not stats:
    print(f"{device.platform}: the device does not count its memory; compared in the suite")
    sys.exit(0)
step(1.0)
jax.block_until_ready(total.value)
before = device.memory_stats()
step(2.0)
jax.block_until_ready(total.value)
after = device.memory_stats()
grown = after["peak_bytes_in_use"] - before["bytes_in_use"]
print(f"{device}: a call grew the allocator's peak by {grown / 2**20:.1f} MiB; "
      f"XLA's plan: temporaries {report.temp_bytes / 2**20:.1f} MiB")
assert 0.75 * report.temp_bytes <= grown <= 1.5 * report.temp_bytes + 64 * 2**20, grown
"""


class Check:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.lines: list[str] = []
        self.failed: list[str] = []

    def run(self, name: str, command: list[str], env: dict[str, str] | None = None) -> str:
        """Runs one step, logging to ``<out>/<name>.log``; adds its verdict and tail."""
        log = self.out / f"{name}.log"
        start = time.perf_counter()
        environment = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        with log.open("w") as stream:
            stream.write("$ " + " ".join(command) + "\n")
            stream.flush()
            code = subprocess.call(
                command, cwd=ROOT, env=environment, stdout=stream, stderr=subprocess.STDOUT
            )
        seconds = time.perf_counter() - start
        verdict = "PASS" if code == 0 else f"FAIL (exit status {code})"
        if code != 0:
            self.failed.append(name)
        tail = log.read_text(errors="replace").splitlines()[-12:]
        self.lines += [
            f"== {name}: {verdict}, {seconds:.0f} s",
            *("   " + line for line in tail),
            "",
        ]
        return log.read_text(errors="replace")

    def note(self, text: str) -> None:
        self.lines.append(text)

    def write(self) -> Path:
        report = self.out / "gpu_check.txt"
        summary = "all steps passed" if not self.failed else "FAILED: " + ", ".join(self.failed)
        report.write_text("\n".join([*self.lines, f"gpu_check: {summary}"]) + "\n")
        return report


def has_gpu() -> bool:
    probe = (
        "import jax, sys\n"
        "try:\n    sys.exit(0 if jax.devices('gpu') else 1)\n"
        "except RuntimeError:\n    sys.exit(1)"
    )
    return subprocess.call([sys.executable, "-c", probe], cwd=ROOT, stderr=subprocess.DEVNULL) == 0


def left_out() -> list[str]:
    """The tests needing a tool this Python lacks."""
    return [
        test
        for tool, tests in OPTIONAL_TOOLS.items()
        if importlib.util.find_spec(tool) is None
        for test in tests
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description="statevar's GPU check")
    parser.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "gpu_check")
    )
    parser.add_argument("--cpu-only", action="store_true", help="the CPU path alone")
    parser.add_argument("--tests", nargs="*", default=["tests"], help="the CPU suite's tests")
    parser.add_argument("--gib", type=float, default=1.0, help="the bandwidth step's size")
    parser.add_argument("--workers", type=int, default=8, help="pytest-xdist workers, if present")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    check = Check(args.out)
    python = sys.executable
    gpu = has_gpu()
    platform = {"JAX_PLATFORMS": "cpu"} if args.cpu_only else {}
    check.note(
        f"statevar GPU check, {time.strftime('%Y-%m-%d %H:%M:%S')}, python {sys.version.split()[0]}"
    )
    check.note(f"GPU found: {gpu}{' (ignored: --cpu-only)' if args.cpu_only else ''}\n")
    if not gpu and not args.cpu_only:
        check.failed.append("no GPU found")

    check.run("environment", [python, "-c", "import sys\n" + ENVIRONMENT, str(ROOT)], platform)
    if args.cpu_only:
        check.note("== gpu-tests: skipped (--cpu-only)\n")
    elif not gpu:
        check.note("== gpu-tests: skipped (no GPU found)\n")
    else:
        check.run(
            "gpu-tests",
            [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PLACEMENT_AND_DONATION_TESTS],
        )

    missing = left_out()
    deselect = [flag for test in missing for flag in ("--deselect", test)]
    parallel = (
        ["-n", str(args.workers)] if args.workers > 1 and importlib.util.find_spec("xdist") else []
    )
    check.run(
        "cpu-suite",
        [
            python,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:benchmark",
            *parallel,
            *deselect,
            *args.tests,
        ],
        {"JAX_PLATFORMS": "cpu"},
    )
    if missing:
        check.note(f"   left out, their tools missing here: {', '.join(missing)}\n")

    check.run(
        "bandwidth", [python, "benchmarks/assign.py", "--gib", str(args.gib), "--check"], platform
    )
    check.run("memory-report", [python, "-c", MEMORY_REPORT, str(args.gib)], platform)
    report = check.write()
    print(report.read_text())
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
