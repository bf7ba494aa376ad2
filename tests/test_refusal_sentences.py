"""Refusals a newcomer meets in the tour, said so that the next request is the right one (found by a tester
following docs/tour.md in a terminal): a token of the wrong kind named, how a retired reader comes back,
why a lease is not this reader's, and how a reader gets the act capability. Each beside its control."""

from __future__ import annotations

import pytest
from enginekit import Harness, make_store

pytestmark = pytest.mark.quick

T = "com.example.ci.run"


@pytest.fixture
def h(tmp_path):
    harness = Harness(make_store("memory", tmp_path))
    yield harness
    harness.store.close()


def test_a_token_of_another_kind_is_named_and_a_wrong_one_of_the_right_kind_is_not(h: Harness) -> None:
    owner = h.monitor("tour", visibility="public", types=[T])
    sub, reader = h.subscribe("tour")
    pulled = h.pull(sub, owner)
    assert pulled.status == 401 and "The token sent is an owner token." in pulled.body["error"]
    assert pulled.body["error"].endswith("Send Authorization: Bearer <reader token>.")
    published = h.publish("tour", reader)
    assert published.status == 401 and "The token sent is a reader token" in published.body["error"]
    # a wrong token of the right kind (or no known kind) says nothing more: it reveals nothing either way
    for wrong in ("mpr_" + "x" * 43, "nonsense"):
        refused = h.pull(sub, wrong)
        assert refused.status == 401 and "The token sent" not in refused.body["error"]
    assert h.pull(sub, reader).status == 200  # control: the reader's own token
    assert h.publish("tour", owner).status == 201


def test_a_retired_reader_is_told_which_bearer_brings_it_back(h: Harness) -> None:
    owner = h.monitor("quiet", types=[T])  # private: a subscribe without a token is a 404
    sub, reader = h.subscribe("quiet", owner, subscriber="agent:sleepy")
    assert h.call("POST", f"/subscriptions/{sub}/retire", {"reason": "tour"}, reader).status == 200
    refused = h.pull(sub, reader)
    assert refused.status == 404 and refused.body["retired"] is True
    assert "send this reader token, or the owner's, as the bearer" in refused.body["error"]
    # doing what the sentence says brings it back, with a new token
    back = h.call("POST", "/subscriptions", {"monitor": "quiet", "subscriber": "agent:sleepy"}, reader)
    assert back.status == 201 and back.body["token"] != reader
    assert h.pull(sub, back.body["token"]).status == 200
    # control: without a bearer the private monitor stays invisible
    again = h.call("POST", "/subscriptions", {"monitor": "quiet", "subscriber": "agent:sleepy"})
    assert again.status == 404


def test_a_lease_not_held_says_whether_someone_else_holds_it(h: Harness) -> None:
    owner = h.monitor("work", visibility="public", types=[T], capabilities=["observe", "act"])
    assert h.publish("work", owner, subject="build-3").status == 201
    first, first_token = h.subscribe("work", owner, subscriber="agent:one", capabilities=["observe", "act"])
    second, second_token = h.subscribe("work", owner, subscriber="agent:two", capabilities=["observe", "act"])
    free = h.call("POST", f"/subscriptions/{first}/leases/complete", {"subject": "build-3"}, first_token)
    assert free.status == 409 and free.body["code"] == "LEASE_LOST"
    assert "nobody holds it now" in free.body["error"] and "claim it first" in free.body["error"]
    claimed = h.call("POST", f"/subscriptions/{first}/leases/claim", {"subject": "build-3"}, first_token)
    assert claimed.status == 201, claimed.body
    taken = h.call("POST", f"/subscriptions/{second}/leases/complete", {"subject": "build-3"}, second_token)
    assert taken.status == 409 and taken.body["holder"] == f"sub:{first}"
    assert "another subscription holds it until 20" in taken.body["error"]
    assert "claim it once it is free" in taken.body["error"]
    body = {"subject": "build-3", "outcome": "done"}
    done = h.call("POST", f"/subscriptions/{first}/leases/complete", body, first_token)
    assert done.status == 200, done.body  # control: the holder completes it


def test_a_lease_without_act_says_how_to_get_it(h: Harness) -> None:
    owner = h.monitor("work", visibility="public", types=[T], capabilities=["observe", "act"])
    assert h.publish("work", owner, subject="build-3").status == 201
    sub, token = h.subscribe("work", subscriber="agent:anyone")  # the default grant: observe
    refused = h.call("POST", f"/subscriptions/{sub}/leases/claim", {"subject": "build-3"}, token)
    assert refused.status == 403 and refused.body["code"] == "CAPABILITY_MISSING"
    assert "subscribe again asking for it, with the owner token" in refused.body["error"]
    # doing so: the owner's grant includes act
    sub, token = h.subscribe("work", owner, subscriber="agent:anyone", capabilities=["observe", "act"])
    assert h.call("POST", f"/subscriptions/{sub}/leases/claim", {"subject": "build-3"}, token).status == 201


def test_act_the_monitor_does_not_offer_is_the_owners_to_add(h: Harness) -> None:
    """Found by an agent builder on MCP: on a monitor offering only observe, both refusals sent the owner
    round in a loop (subscribe with the owner token; ask the owner for the owner token)."""
    owner = h.monitor("plain", visibility="public", types=[T])  # capabilities: observe only
    assert h.publish("plain", owner, subject="build-3").status == 201
    sub, token = h.subscribe("plain", owner, subscriber="agent:worker")
    claim = h.call("POST", f"/subscriptions/{sub}/leases/claim", {"subject": "build-3"}, token)
    assert claim.status == 403 and "does not offer it" in claim.body["error"]
    assert "its owner adds act to the monitor's capabilities (an update)" in claim.body["error"]
    ask = {"monitor": "plain", "subscriber": "agent:worker", "capabilities": ["observe", "act"]}
    refused = h.call("POST", "/subscriptions", ask, owner)
    assert (
        refused.status == 403
        and "its owner adds ['act'] to the monitor's capabilities" in refused.body["error"]
    )
    # doing what they say
    patch = {"patch": {"capabilities": ["observe", "act"]}, "reason": "workers claim builds"}
    assert h.call("POST", "/monitors/plain/update", patch, owner).status == 200
    again = h.call("POST", "/subscriptions", ask, owner)
    assert again.status == 201, again.body
    claim = h.call("POST", f"/subscriptions/{sub}/leases/claim", {"subject": "build-3"}, again.body["token"])
    assert claim.status == 201, claim.body
    # control: a stranger on a monitor that offers act is still sent to the owner for a token
    stranger = h.call("POST", "/subscriptions", {**ask, "subscriber": "agent:stranger"})
    assert (
        stranger.status == 403 and "Ask the owner for the owner or subscribe token." in stranger.body["error"]
    )


def test_a_renewed_subscription_says_the_earlier_token_stopped_working(h: Harness) -> None:
    """Found by an agent builder: a second session subscribing with the same subscriber name replaced the
    first one's token silently."""
    owner = h.monitor("shared-name", visibility="public", types=[T])
    first = h.call("POST", "/subscriptions", {"monitor": "shared-name", "subscriber": "agent:a"}, owner)
    assert "was renewed" not in first.body["notice"]  # control: a new subscription
    second = h.call("POST", "/subscriptions", {"monitor": "shared-name", "subscriber": "agent:a"}, owner)
    assert second.body["subscription"]["id"] == first.body["subscription"]["id"]
    assert "was renewed" in second.body["notice"] and "no longer works" in second.body["notice"]
    assert h.pull(first.body["subscription"]["id"], first.body["token"]).status == 401
