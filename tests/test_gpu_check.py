"""The GPU check's CPU path (``tools/gpu_check.sh --cpu-only``): what runs on a machine
without a GPU, kept small (one test file, a small bandwidth run)."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHECK = ROOT / "tools" / "gpu_check.sh"


def _run(out, *arguments):
    environment = {**os.environ, "PYTHON": sys.executable, "JAX_PLATFORMS": "cpu"}
    environment.pop("OUT", None)
    return subprocess.run(
        ["bash", str(CHECK), "--out", str(out), *arguments],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_cpu_path_runs_each_step_and_writes_one_report(tmp_path):
    completed = _run(
        tmp_path,
        "--cpu-only",
        "--tests",
        "tests/test_public_api.py",
        "--gib",
        "0.01",
        "--workers",
        "1",
    )
    report = (tmp_path / "gpu_check.txt").read_text()
    assert completed.returncode == 0, report
    assert "GPU found: False" in report or "(ignored: --cpu-only)" in report
    for step in ("environment", "cpu-suite", "bandwidth", "memory-report"):
        assert f"== {step}: PASS" in report, report
    assert "== gpu-tests: skipped (--cpu-only)" in report
    assert "statevar 0.1.0 from " + str(ROOT / "statevar") in report
    assert "assign_add bandwidth >= 85% of a copy's" in (tmp_path / "bandwidth.log").read_text()
    assert report.rstrip().endswith("gpu_check: all steps passed")


def test_without_a_gpu_the_full_check_fails_and_says_why(tmp_path):
    completed = _run(
        tmp_path, "--tests", "tests/test_public_api.py", "--gib", "0.01", "--workers", "1"
    )
    report = (tmp_path / "gpu_check.txt").read_text()
    assert completed.returncode == 1
    assert "GPU found: False" in report
    assert "FAILED: no GPU found" in report
