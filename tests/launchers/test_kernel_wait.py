"""The main shell's inbox read while a cell waits, with a real jupyter_client Session signing
real messages and a stand-in socket: a click is handled, the rest is kept whole and in order."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
import zmq
from jupyter_client.session import Session

from orch.launchers import kernel_wait as clicks
from orch.launchers.kernel_wait import Waiting, _Inbox

pytestmark = pytest.mark.unit


class Socket:
    """The part of a ZMQ socket an inbox uses, holding queued multipart messages."""

    def __init__(self, queued: list[list[zmq.Frame]]) -> None:
        self.queued = queued

    def poll(self, timeout: int, flags: int) -> int:
        return zmq.POLLIN if self.queued else 0

    def recv_multipart(self, flags: int, copy: bool) -> list[zmq.Frame]:
        if not self.queued:
            raise zmq.Again()
        return self.queued.pop(0)


class Comm:
    def __init__(self) -> None:
        self.comm_id = uuid.uuid4().hex
        self.handled: list[dict[str, Any]] = []

    def handle_msg(self, msg: dict[str, Any]) -> None:
        self.handled.append(msg)


class Kernel:
    def __init__(self, session: Session) -> None:
        self.session = session


def frames(session: Session, msg_type: str, content: dict[str, Any]) -> list[zmq.Frame]:
    """A message as the kernel's socket hands it over (identity, delimiter, signed parts)."""
    parts = session.serialize(session.msg(msg_type, content), ident=[b"frontend"])
    return [zmq.Frame(p) for p in parts]


def test_a_click_or_a_change_is_handled_and_everything_else_is_kept_whole_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session = Session(key=b"secret")
    stop, other = Comm(), Comm()
    monkeypatch.setattr(clicks, "_clickable", {stop.comm_id: stop})
    queued = [
        frames(session, "execute_request", {"code": "print('next')"}),
        frames(session, "comm_msg", {"comm_id": stop.comm_id, "data": {"method": "update", "state": {}}}),
        frames(session, "comm_msg", {"comm_id": stop.comm_id, "data": {"method": "request_state"}}),
        frames(session, "comm_msg", {"comm_id": other.comm_id, "data": {"method": "custom", "content": {}}}),
        frames(
            session,
            "comm_msg",
            {"comm_id": stop.comm_id, "data": {"method": "custom", "content": {"event": "click"}}},
        ),
        frames(session, "kernel_info_request", {}),
        [zmq.Frame(b"stop aborting")],  # what ipykernel 7 posts to itself after an error
    ]
    expected = [queued[i] for i in (0, 2, 3, 5, 6)]
    given: list[list[Any]] = []
    inbox = _Inbox(Kernel(session), Socket(list(queued)), given.extend, zmq)

    inbox.read(0.01)
    # the user's change (a dropdown's new value) and the click, in the order they came
    assert [m["content"]["data"]["method"] for m in stop.handled] == ["update", "custom"]
    assert stop.handled[1]["content"]["data"]["content"] == {"event": "click"}
    assert other.handled == [] and given == []  # kept until the wait ends
    inbox.close()
    assert given == expected  # the same frames, in the order they came
    # The kernel can still read each one: peeking recorded no signature as seen.
    types = []
    for kept in given[:-1]:
        _, parts = session.feed_identities(kept, copy=False)
        types.append(session.deserialize(parts, content=True, copy=False)["header"]["msg_type"])
    assert types == ["execute_request", "comm_msg", "comm_msg", "kernel_info_request"]


def test_outside_a_kernel_a_wait_is_a_plain_wait() -> None:
    event = threading.Event()
    with Waiting() as waiting:
        started = time.monotonic()
        assert waiting.until(event, 0.05) is False
        assert time.monotonic() - started >= 0.05
        threading.Timer(0.05, event.set).start()
        assert waiting.until(event, 30) is True
        waiting.sleep(0.01)
