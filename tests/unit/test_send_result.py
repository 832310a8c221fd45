"""SendResult._of, the producer's constructor (a slots object turned into a SendResult): the
same object as __init__ makes, frozen, equal, hashable, copyable and picklable alike."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tracemq.message import MessageQueue, SendResult, SendStatus

_ARGS = st.tuples(
    st.sampled_from(list(SendStatus)),
    st.text(max_size=40),
    st.text(max_size=40),
    st.builds(MessageQueue, st.text(max_size=10), st.text(max_size=10), st.integers(0, 65535)),
    st.integers(0, 2**48),
    st.text(max_size=10),
    st.booleans(),
    st.integers(0, 2**62),
    st.none() | st.text(max_size=40),
)


@given(_ARGS)
def test_of_makes_what_init_makes(args: tuple[object, ...]) -> None:
    made, built = SendResult._of(*args), SendResult(*args)  # type: ignore[arg-type]
    assert type(made) is SendResult
    assert made == built and hash(made) == hash(built) and repr(made) == repr(built)
    assert tuple(getattr(made, f.name) for f in dataclasses.fields(SendResult)) == args
    assert copy.copy(made) == built and pickle.loads(pickle.dumps(made)) == built


def test_of_is_frozen() -> None:
    r = SendResult._of(
        SendStatus.SEND_OK, "m", "o", MessageQueue("T", "b", 1), 5, "R", True, 1, None
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.msg_id = "other"  # type: ignore[misc]


def test_of_on_a_subclass_takes_its_init() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Sub(SendResult):
        extra: int = 7

    r = Sub._of(SendStatus.SEND_OK, "m", "o", MessageQueue("T", "b", 1), 5, "R", True, 1, None)
    assert type(r) is Sub and r.extra == 7 and r.msg_id == "m"
