"""Issue 25: what an operator upgrade does to DurableStreams that pin no image
(server_image.py, pure): ``roll`` takes the operator's image at once, ``hold`` keeps the
one in use until the spec changes or the owner asks."""

from __future__ import annotations

import json

from stream_operator.decisions.server_image import (
    HOLD,
    IN_USE,
    ROLL,
    Choice,
    choose,
    in_use,
    record,
)


def sts(image: str, annotation: str | None = None) -> dict:
    meta = {"annotations": {IN_USE: annotation}} if annotation else {}
    containers = [{"name": "server", "image": image}]
    return {"metadata": meta, "spec": {"template": {"spec": {"containers": containers}}}}


USED = {"image": "ds:1", "generation": 4}


def test_roll_takes_the_operators_image_and_a_pin_always_wins():
    assert choose(None, "ds:2", ROLL, USED, 4, False) == Choice("ds:2")
    assert choose("mine:7", "ds:2", ROLL, USED, 4, False) == Choice("mine:7")
    assert choose("mine:7", "ds:2", HOLD, USED, 4, False) == Choice("mine:7")


def test_hold_keeps_the_image_in_use_and_names_the_one_held_back():
    assert choose(None, "ds:2", HOLD, USED, 4, False) == Choice("ds:1", available="ds:2")
    # Nothing held back when the operator's image is the one in use.
    assert choose(None, "ds:1", HOLD, USED, 4, False) == Choice("ds:1")


def test_hold_lets_go_on_a_spec_change_or_when_asked_and_a_new_object_starts_current():
    assert choose(None, "ds:2", HOLD, USED, 5, False) == Choice("ds:2")  # spec changed
    assert choose(None, "ds:2", HOLD, USED, 4, True) == Choice("ds:2")  # the owner asked
    assert choose(None, "ds:2", HOLD, None, 1, False) == Choice("ds:2")  # no StatefulSet yet


def test_the_image_in_use_is_the_record_else_the_template_of_an_older_statefulset():
    assert in_use(None) is None
    assert in_use(sts("ds:1", record("ds:1", 4))) == {"image": "ds:1", "generation": 4}
    # Made by an operator before the record existed: its image, its spec taken as unchanged.
    older = in_use(sts("ds:0"))
    assert older == {"image": "ds:0", "generation": None}
    assert choose(None, "ds:2", HOLD, older, 9, False) == Choice("ds:0", available="ds:2")
    assert in_use(sts("ds:0", "not json")) == older
    assert json.loads(record("x", 2)) == {"image": "x", "generation": 2}
