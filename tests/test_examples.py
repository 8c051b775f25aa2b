"""Runs the scripts in ``examples/`` in-process and checks what they print and return."""

from __future__ import annotations

import importlib.util
import logging
import pathlib

import jax
import matplotlib.image
import numpy as np
import pytest

import statevar

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def load_example(name):
    """Imports ``examples/<name>.py`` as a module, without running its ``__main__`` block."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def train_example():
    # Loaded once, so that its jitted make_dataset compiles once for every test here.
    return load_example("train")


def parameters(model):
    return {name: np.asarray(v.value) for name, v in model.named_variables().items()}


def test_variables_tour_prints_each_section(capsys):
    logger = logging.getLogger("statevar")
    level = logger.level
    try:
        load_example("variables_tour").main()
    finally:
        logger.setLevel(level)  # the tour turns the statevar logger up to INFO
    out = capsys.readouterr().out
    assert f"statevar {statevar.__version__} on jax {jax.__version__}" in out
    assert (
        "Caught ShapeMismatchError: Cannot assign to Variable 'Variable': shape (3,) does not "
        "match the variable's shape (2,)"
    ) in out
    assert "Caught DtypeMismatchError: Cannot assign to Variable 'counter'" in out
    assert "counter unchanged after the rejected assign: [1 2]" in out
    assert "A read taken before assign_add stays valid: [1. 2.] -> now [11. 12.]" in out
    assert "After v[0] = 9 and v[1:] = [7, 8]: [9. 7. 8.]" in out
    assert "[log] statevar: Variable 'logged': assign_add on cpu:0" in out
    assert "Unexpected warning" not in out
    assert "With soft placement off, caught PlacementError" in out


def test_gradients_example_prints_the_expected_gradients(capsys):
    load_example("gradients").main()
    out = capsys.readouterr().out
    assert "dy/d[w, not_trained] = [Array(12., dtype=float32), None]" in out
    assert "d loss/dx = [2.0, 4.0, 6.0]" in out
    assert "d loss/dw: [-5.0, -7.0] ; d loss/db: [-2.0]" in out
    assert "no gradient for: ['layers/0/kernel', 'calls']" in out
    assert "after setting it back to True: ['calls']" in out
    assert "w after: [0.125, -0.25, 0.375]" in out


def test_train_prints_a_summary_lowers_the_loss_and_saves_checkpoints_and_a_curve(
    train_example, tmp_path, capsys
):
    directory = tmp_path / "checkpoints"
    run = train_example.main(
        ["--steps", "50", "--save-every", "20", "--checkpoint-dir", str(directory),
         "--max-loss-ratio", "0.5"]
    )  # fmt: skip
    assert run.final < run.first
    assert run.step == 50 and run.resumed_from is None
    out = capsys.readouterr().out
    assert "saved step 20" in out and "saved step 50" in out
    assert statevar.CheckpointManager(directory).all_steps() == [20, 40, 50]
    # The summary comes first; the loss curve goes beside the checkpoints.
    assert out.index("Total: 2,179 params (8.5 KiB) in 5 variables") < out.index("first loss")
    assert "  layers/0/kernel  (32, 64)   float32  yes" in out
    assert "  rng/state        (2,)       uint32   no" in out  # the dropout generator's key
    assert f"wrote the loss curve to {str(directory / 'loss.png')!r}" in out
    image = matplotlib.image.imread(directory / "loss.png")
    assert image.shape == (400, 600, 4)  # 6 x 4 inches at 100 dpi, RGBA
    assert image[..., :3].std() > 0.05  # not blank


def test_train_resumes_where_it_stopped_as_if_never_interrupted(train_example, tmp_path, capsys):
    interrupted, uninterrupted = str(tmp_path / "interrupted"), str(tmp_path / "uninterrupted")
    common = ["--save-every", "20", "--max-loss-ratio", "1"]
    train_example.main(["--steps", "30", "--checkpoint-dir", interrupted, *common])
    capsys.readouterr()

    resumed = train_example.main(
        ["--steps", "70", "--resume", "--checkpoint-dir", interrupted, *common]
    )
    out = capsys.readouterr().out
    assert f"resumed from step 30 in {interrupted!r}" in out
    assert resumed.resumed_from == 30 and resumed.step == 70
    assert statevar.CheckpointManager(interrupted).all_steps() == [20, 30, 40, 60, 70]

    whole = train_example.main(["--steps", "70", "--checkpoint-dir", uninterrupted, *common])
    assert whole.resumed_from is None and whole.step == 70
    expected = parameters(whole.model)
    got = parameters(resumed.model)
    assert list(got) == list(expected)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    assert resumed.final == whole.final


def test_train_without_resume_refuses_a_directory_with_checkpoints(train_example, tmp_path, capsys):
    directory = str(tmp_path / "checkpoints")
    common = ["--checkpoint-dir", directory, "--max-loss-ratio", "1"]
    train_example.main(["--steps", "20", "--save-every", "10", *common])
    capsys.readouterr()

    with pytest.raises(SystemExit) as exit_info:
        train_example.main(["--steps", "5", *common])
    assert exit_info.value.code == 2
    assert (
        f"--checkpoint-dir {directory!r} already holds the checkpoints of steps [10, 20]: pass "
        "--resume to continue from step 20"
    ) in capsys.readouterr().err
    assert statevar.CheckpointManager(directory).all_steps() == [10, 20]


def test_train_keeps_only_its_own_last_checkpoints(train_example, tmp_path, capsys):
    directory = str(tmp_path / "checkpoints")
    common = ["--checkpoint-dir", directory, "--max-loss-ratio", "1", "--save-every", "5"]
    train_example.main(["--steps", "10", *common])
    train_example.main(["--steps", "30", "--resume", "--keep", "2", *common])
    # Steps 5 and 10 were made by the first run: the second deletes only its own (15, 20).
    assert statevar.CheckpointManager(directory).all_steps() == [5, 10, 25, 30]


def test_train_resume_with_no_checkpoint_starts_at_step_zero(train_example, tmp_path, capsys):
    directory = str(tmp_path / "checkpoints")
    run = train_example.main(
        ["--steps", "5", "--resume", "--checkpoint-dir", directory, "--max-loss-ratio", "1"]
    )
    assert f"no checkpoint in {directory!r} to resume from: starting at step 0" in (
        capsys.readouterr().out
    )
    assert run.resumed_from is None and run.step == 5


def test_train_fails_when_the_loss_does_not_fall_enough(train_example, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_example.main(["--steps", "0", "--checkpoint-dir", str(tmp_path)])
    assert exit_info.value.code == 1
    assert "training did not converge" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--save-every", "0"], "--save-every must be a positive number of steps, got 0"),
        (["--batch-size", "0"], "--batch-size must be between 1 and 4096, got 0"),
        (["--keep", "0"], "--keep must be a positive number of checkpoints, got 0"),
        (["--dropout", "1"], "--dropout must be at least 0 and below 1, got 1.0"),
        (["--dropout", "-0.5"], "--dropout must be at least 0 and below 1, got -0.5"),
    ],
)
def test_train_rejects_invalid_arguments(train_example, tmp_path, capsys, arguments, message):
    with pytest.raises(SystemExit) as exit_info:
        train_example.main([*arguments, "--checkpoint-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_train_rejects_a_checkpoint_dir_that_is_a_file(train_example, tmp_path, capsys):
    path = tmp_path / "a_file"
    path.write_text("not a directory")
    with pytest.raises(SystemExit) as exit_info:
        train_example.main(["--checkpoint-dir", str(path)])
    assert exit_info.value.code == 2
    assert f"--checkpoint-dir {str(path)!r} exists and is not a directory" in (
        capsys.readouterr().err
    )


def test_train_scan_runs_many_steps_per_call_and_skips_non_finite_ones(capsys):
    example = load_example("train_scan")

    status = example.main(
        [
            "--steps",
            "20",
            "--steps-per-call",
            "10",
            "--corrupt-every",
            "8",
            "--max-loss-ratio",
            "0.5",
        ]
    )

    out = capsys.readouterr().out
    assert "10 steps in one call equal 10 separate calls: True" in out
    assert "steps 1-10: mean loss" in out and "9 applied, 1 skipped" in out
    assert "steps 11-20: mean loss" in out and "18 applied, 2 skipped" in out
    assert status == 0, out


def test_train_scan_rejects_a_step_count_that_is_not_a_multiple_of_the_chunk(capsys):
    example = load_example("train_scan")

    with pytest.raises(SystemExit):
        example.main(["--steps", "15", "--steps-per-call", "10"])

    assert "--steps must be a multiple of --steps-per-call" in capsys.readouterr().err


def test_train_sharded_matches_one_device(capsys):
    results = load_example("train_sharded").main(["--steps", "6", "--batch", "16"])
    single_losses, single_params = results["single"]
    for strategy in ("data_parallel", "fsdp"):
        losses, params = results[strategy]
        np.testing.assert_allclose(losses, single_losses, rtol=1e-5, atol=1e-5)
        for name, value in params.items():
            np.testing.assert_allclose(value, single_params[name], rtol=1e-5, atol=1e-5)
    assert single_losses[-1] < single_losses[0]
    out = capsys.readouterr().out
    assert f"{len(jax.devices())} devices: cpu" in out
    assert "fsdp: loss" in out and "data_parallel: loss" in out
    per_replica = [16 // len(jax.devices()) * 6] * len(jax.devices())
    assert f"fsdp: 96 examples, {per_replica} per replica" in out


def test_train_sharded_rejects_a_batch_the_devices_do_not_divide(capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_example("train_sharded").main(["--batch", "12"])
    assert exit_info.value.code == 2
    assert f"--batch 12 must be a multiple of the {len(jax.devices())} devices" in (
        capsys.readouterr().err
    )
