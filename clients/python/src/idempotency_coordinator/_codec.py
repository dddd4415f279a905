"""How a work's value becomes the stored result, and back."""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

try:
    from typing import Protocol
except ImportError:  # pragma: no cover - Python < 3.8
    from typing_extensions import Protocol  # type: ignore[assignment]

__all__ = ["Codec", "JsonCodec", "BytesCodec"]


class Codec(Protocol):
    """Encodes the work's value for Complete and decodes a replayed one."""

    @property
    def content_type(self) -> str: ...

    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes, content_type: str) -> Any: ...


class JsonCodec:
    """The default: the value as compact UTF-8 JSON (``application/json``).

    ``default`` is passed to :func:`json.dumps` for values it cannot encode
    (for example ``str`` for dates), ``object_hook`` to :func:`json.loads`."""

    def __init__(
        self,
        *,
        default: Optional[Callable[[Any], Any]] = None,
        object_hook: Optional[Callable[[dict], Any]] = None,  # type: ignore[type-arg]
    ) -> None:
        self._default = default
        self._object_hook = object_hook

    @property
    def content_type(self) -> str:
        return "application/json"

    def encode(self, value: Any) -> bytes:
        return json.dumps(value, default=self._default, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    def decode(self, data: bytes, content_type: str) -> Any:
        if not data:
            return None
        return json.loads(data.decode("utf-8"), object_hook=self._object_hook)


class BytesCodec:
    """The value is ``bytes`` (or ``bytearray``/``memoryview``), stored as
    is; replays return ``bytes``."""

    def __init__(self, content_type: str = "application/octet-stream") -> None:
        self._content_type = content_type

    @property
    def content_type(self) -> str:
        return self._content_type

    def encode(self, value: Any) -> bytes:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        raise TypeError(f"BytesCodec encodes bytes, not {type(value).__name__}")

    def decode(self, data: bytes, content_type: str) -> Any:
        return bytes(data)
