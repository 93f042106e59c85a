import dataclasses
import pickle

import pytest

from llm_epp.framework import InferenceRequest, RequestBody
from llm_epp.framework.records import record
from llm_epp.framework.types import ApiKind


@record
class Point:
    x: int
    y: int = 0
    tags: list[str] = dataclasses.field(default_factory=list)


def test_fields_are_set_positionally_and_by_keyword_with_defaults_and_factories():
    p = Point(1)
    assert (p.x, p.y, p.tags) == (1, 0, [])
    q = Point(y=5, x=2, tags=["a"])
    assert (q.x, q.y, q.tags) == (2, 5, ["a"])
    assert Point(1).tags is not Point(1).tags  # the factory runs per instance
    assert Point(3, 4) == Point(3, 4, [])
    assert repr(Point(3, 4)) == "Point(x=3, y=4, tags=[])"


def test_a_record_stays_frozen_and_slotted():
    p = Point(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del p.y  # type: ignore[misc]
    assert not hasattr(p, "__dict__")
    assert hash(Point(1, 2, ())) == hash(Point(1, 2, ()))  # type: ignore[arg-type]


def test_replace_pickle_and_bad_calls_behave_as_for_a_dataclass():
    p = Point(1, 2, ["t"])
    assert dataclasses.replace(p, y=9) == Point(1, 9, ["t"])
    assert pickle.loads(pickle.dumps(p)) == p
    with pytest.raises(TypeError):
        Point()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Point(1, z=3)  # type: ignore[call-arg]


def test_what_a_record_cannot_express_is_refused_at_definition():
    with pytest.raises(TypeError, match="__post_init__"):

        @record
        class Checked:
            x: int

            def __post_init__(self) -> None:
                pass

    with pytest.raises(TypeError, match="keyword-only"):

        @record
        class KwOnly:
            x: int = dataclasses.field(kw_only=True)

    with pytest.raises(TypeError, match="constructor"):

        @record
        class Derived:
            x: int
            y: int = dataclasses.field(init=False, default=0)


def test_the_request_types_plugins_receive_are_records():
    body = RequestBody(ApiKind.COMPLETIONS, {"prompt": "hi"})
    request = InferenceRequest("r1", "m", "m", body, priority=3)
    assert (request.priority, request.fairness_id, request.headers) == (3, "default-flow", {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.priority = 9  # type: ignore[misc]
