"""The public surface: every name in ``statevar.__all__`` exists and is importable."""

import pytest

import statevar


@pytest.mark.parametrize("name", statevar.__all__)
def test_every_name_in_all_exists(name):
    assert getattr(statevar, name, None) is not None


def test_all_has_no_duplicates_and_no_private_names():
    assert len(set(statevar.__all__)) == len(statevar.__all__)
    assert not [name for name in statevar.__all__ if name.startswith("_")]


def test_star_import_gives_exactly_all():
    namespace = {}
    exec("from statevar import *", namespace)

    assert set(namespace) - {"__builtins__"} == set(statevar.__all__)


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        ("ShapeMismatchError", ValueError),
        ("DtypeMismatchError", TypeError),
        ("PlacementError", ValueError),
        ("TraceContextError", RuntimeError),
        ("CheckpointNotFoundError", FileNotFoundError),
        ("CheckpointMismatchError", ValueError),
        ("CheckpointCorruptedError", ValueError),
        ("CheckpointWriteError", OSError),
        ("CopyError", BufferError),
    ],
)
def test_errors_subclass_the_builtin_a_user_would_catch(error, builtin):
    cls = getattr(statevar, error)

    assert issubclass(cls, builtin)
    assert issubclass(cls, statevar.StatevarError)


def test_placement_warning_is_a_user_warning():
    assert issubclass(statevar.PlacementWarning, UserWarning)


def test_copy_warning_is_a_user_warning():
    assert issubclass(statevar.CopyWarning, UserWarning)


def test_random_is_a_submodule_whose_names_exist():
    import statevar.random as imported

    assert statevar.random is imported
    assert imported.__all__ == ["Generator", "get_global_generator", "set_global_generator"]
    assert all(getattr(imported, name, None) is not None for name in imported.__all__)
    # A namespace, not a name: a star import leaves the standard library's random alone.
    assert "random" not in statevar.__all__
