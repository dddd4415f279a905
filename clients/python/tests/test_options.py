"""Options and backoff, without a server."""

from __future__ import annotations

import datetime

import pytest

from idempotency_coordinator import Client, Options
from idempotency_coordinator._common import acquire_request


def test_defaults_follow_the_template() -> None:
    o = Options()
    assert o.wait == datetime.timedelta(seconds=10)
    assert o.lease_ttl == datetime.timedelta(seconds=60)
    assert o.call_timeout == datetime.timedelta(seconds=10)
    assert o.max_retries == 5
    assert o.interval == pytest.approx(20.0)
    assert o.acquire_timeout == pytest.approx(20.0)


def test_backoff_doubles_to_its_cap_with_jitter_and_honours_retry_info() -> None:
    o = Options()
    for retry, full in [(0, 0.1), (1, 0.2), (2, 0.4), (3, 0.8), (4, 1.6), (5, 2.0), (9, 2.0)]:
        for _ in range(50):
            d = o.backoff(retry, None)
            assert full / 2 <= d <= full
    assert o.backoff(0, datetime.timedelta(seconds=3)) >= 3.0


def test_options_take_seconds_and_refuse_unknown_names() -> None:
    o = Options().merged(lease_ttl=5, wait=0.5, heartbeat_interval=1)
    assert o.lease_ttl == datetime.timedelta(seconds=5)
    assert o.wait == datetime.timedelta(milliseconds=500)
    assert o.interval == 1.0
    with pytest.raises(TypeError):
        Options().merged(lease_tll=5)
    with pytest.raises(ValueError):
        Options().merged(lease_ttl=0.5)


def test_acquire_request_fields() -> None:
    o = Options().merged(max_attempts=3, retention=3600, wait=0)
    req = acquire_request("s", "k", o, "rid", fingerprint=None, payload=None, json_payload={"b": 2, "a": 1})
    assert req.json_payload == '{"b":2,"a":1}'
    assert req.max_attempts == 3 and req.retention.seconds == 3600
    assert not req.HasField("wait") and req.lease_ttl.seconds == 60 and req.request_id == "rid"
    with pytest.raises(ValueError):
        acquire_request("s", "k", o, "rid", fingerprint="f", payload=b"p", json_payload=None)


def test_client_options_are_validated() -> None:
    import grpc

    with grpc.insecure_channel("127.0.0.1:1") as channel, pytest.raises(TypeError):
        Client(channel, no_such_option=1)
