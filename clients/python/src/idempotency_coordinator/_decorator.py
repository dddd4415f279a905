"""``@idempotent``: a function that runs once per key."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional, TypeVar, Union, cast

from . import _common as c
from ._aio import AsyncClient
from ._sync import Client

__all__ = ["idempotent", "current_lease"]

F = TypeVar("F", bound=Callable[..., Any])


def current_lease() -> Any:
    """The lease context of the decorated function (or ``run_once`` work)
    running now: a :class:`LeaseContext` or :class:`AsyncLeaseContext`;
    ``None`` outside one."""
    return c.current()


def idempotent(
    client: Union[Client, AsyncClient],
    *,
    scope: str,
    key: Callable[..., str],
    fingerprint: Optional[Callable[..., str]] = None,
    payload: Optional[Callable[..., bytes]] = None,
    json_payload: Optional[Callable[..., Any]] = None,
    **options: Any,
) -> Callable[[F], F]:
    """Make a function run once per ``key(*args, **kwargs)`` in ``scope``.

    The decorated function keeps its signature and returns its value, or the
    stored value on a replay (decoded by the codec: with the JSON default, a
    value that round-trips through JSON). The other outcomes raise the typed
    exceptions of ``run_once``. Works on plain functions with a
    :class:`Client` and on ``async def`` functions with an
    :class:`AsyncClient`. ``fingerprint``, ``payload`` and ``json_payload``
    are computed from the arguments like ``key``; ``options`` are
    ``run_once`` options. Inside, :func:`current_lease` gives the lease."""

    def request(args: Any, kwargs: Any) -> "dict[str, Any]":
        return {
            "fingerprint": fingerprint(*args, **kwargs) if fingerprint else None,
            "payload": payload(*args, **kwargs) if payload else None,
            "json_payload": json_payload(*args, **kwargs) if json_payload else None,
        }

    def decorate(fn: F) -> F:
        if inspect.iscoroutinefunction(fn):
            if not isinstance(client, AsyncClient):
                raise TypeError("an async function needs an AsyncClient")
            aclient = client

            @functools.wraps(fn)
            async def arun(*args: Any, **kwargs: Any) -> Any:
                async def work(_ctx: Any) -> Any:
                    return await fn(*args, **kwargs)

                res = await aclient.run_once(scope, key(*args, **kwargs), work, **request(args, kwargs), **options)
                return res.value

            return cast(F, arun)

        if not isinstance(client, Client):
            raise TypeError("a plain function needs a Client (use an AsyncClient with async def)")
        sclient = client

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            res = sclient.run_once(
                scope, key(*args, **kwargs), lambda _ctx: fn(*args, **kwargs), **request(args, kwargs), **options
            )
            return res.value

        return cast(F, run)

    return decorate
