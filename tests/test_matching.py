"""The pure matching of a checkpoint's names to a restore target's."""

import logging

import pytest

from statevar._checkpoint.names import match_checkpoint

F2 = ((2,), "float32")


@pytest.mark.parametrize(
    ("stored", "wanted", "partial", "refused"),
    [
        ({"a": F2}, {"a": F2}, False, False),
        ({"a": F2, "b": F2}, {"a": F2}, False, True),
        ({"a": F2, "b": F2}, {"a": F2}, True, False),
        ({"b": F2}, {"a": F2}, True, True),  # nothing shared: refused even when partial
        ({"a": ((3,), "float32")}, {"a": F2}, True, True),
        ({"a": F2}, {}, True, False),  # an empty target restores nothing
    ],
)
def test_a_match_is_refused_exactly_when_a_restore_must_change_nothing(
    stored, wanted, partial, refused
):
    assert match_checkpoint(stored, wanted, partial=partial).is_refused is refused


def test_a_match_keeps_the_targets_order_and_renders_its_messages():
    match = match_checkpoint(
        {"old": F2, "b": F2, "a": F2},
        {"a": F2, "b": F2, "new": F2},
        partial=True,
    )
    assert (match.common, match.missing, match.unexpected) == (["a", "b"], ["new"], ["old"])
    assert match.untouched == ["new"]
    level, message = match.report("ckpt")
    assert level == logging.WARNING
    assert message.startswith("Restored 2 of the target's 3 variables from checkpoint 'ckpt'.")
    assert "Left unchanged (not in the checkpoint): new." in message
