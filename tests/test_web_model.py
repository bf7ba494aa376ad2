"""The playground's session (web/model.py, plain Python): what the page keeps that the engine cannot know
(the tokens it was shown once, what each reader holds in memory), saved and read back, and a session saved
by the previous page (one monitor, readers by name) carried over."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

# The quick lane (python3 build.py test --quick): no server, no browser.
pytestmark = pytest.mark.quick

WEB = Path(__file__).resolve().parents[1] / "web"


def load_model():
    spec = importlib.util.spec_from_file_location("playground_model", WEB / "model.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their annotations through the module
    spec.loader.exec_module(mod)
    return mod


def test_a_session_round_trips_and_never_saves_the_shown_token():
    m = load_model()
    s = m.Session(monitor="builds", owners={"builds": "tok-o"}, step=4, story_done=[0, 1])
    s.readers["sub-1"] = m.Reader("sub-1", "reader-a", "tok-r", "builds", held=[2, 3], next=4, crashed=True)
    s.set_worker("worker-a", m.Worker("sub-2", "tok-w", "builds"))
    s.shown_token = "tok-o"
    text = s.to_json()
    assert "shown_token" not in json.loads(text)
    back = m.Session.from_json(text)
    assert back.readers["sub-1"].held == [2, 3] and back.readers["sub-1"].crashed
    assert back.owner_token() == "tok-o" and back.worker("worker-a").sub_id == "sub-2"
    assert back.reader_named("reader-a", "builds").sub_id == "sub-1"
    assert back.reader_named("reader-a", "ci") is None  # names are per monitor
    assert back.shown_token is None


def test_a_previous_pages_session_is_carried_over():
    m = load_model()
    old = {
        "monitor": "ci",
        "owner_token": "tok-o",
        "readers": {"reader-a": {"id": "sub-1", "token": "tok-r", "cursor": 3, "held": []}},
        "workers": {"worker-a": {"id": "sub-2", "token": "tok-w"}},
        "step": 5,
    }
    s = m.Session.from_json(json.dumps(old))
    assert s.monitor == "ci" and s.owners == {"ci": "tok-o"}
    assert s.readers["sub-1"].name == "reader-a" and s.readers["sub-1"].monitor == "ci"
    assert s.worker("worker-a", "ci").token == "tok-w"


def test_nothing_saved_or_garbage_gives_a_fresh_session():
    m = load_model()
    for text in (None, "", "not json", "[1, 2]", json.dumps({"version": 1})):
        s = m.Session.from_json(text)
        assert s.monitor is None and s.owners == {} and s.readers == {}


def test_a_newer_pages_fields_are_ignored_and_a_damaged_session_starts_fresh():
    m = load_model()
    s = m.Session(monitor="builds", owners={"builds": "tok-o"})
    s.readers["sub-1"] = m.Reader("sub-1", "reader-a", "tok-r", "builds")
    data = json.loads(s.to_json())
    data["readers"]["sub-1"]["colour"] = "blue"  # a field a newer page saved
    back = m.Session.from_json(json.dumps(data))
    assert back.readers["sub-1"].token == "tok-r"
    data["readers"]["sub-1"] = "not a record"
    assert m.Session.from_json(json.dumps(data)).owners == {}


def test_two_tabs_saving_keep_both_tabs_tokens():
    m = load_model()
    mine = m.Session(owners={"builds": "tok-a"})
    theirs = m.Session(owners={"bee": "tok-b"})
    theirs.readers["sub-9"] = m.Reader("sub-9", "reader-z", "tok-z", "bee")
    merged = mine.merged_with(m.Session.from_json(theirs.to_json()))
    assert merged.owners == {"builds": "tok-a", "bee": "tok-b"} and "sub-9" in merged.readers
