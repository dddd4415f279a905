"""The READMEs' Python examples, run as written against a real coordinator.

Every ```python block of this package's README and of the repository's
README runs here; only the address changes, to the test server's. What the
examples call "yours" (the order, the payment provider, the mailer, the
answers) gets stand-ins that record what the examples did with them.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List

import pytest

from harness import Server
from idempotency_coordinator import AsyncClient, Client

HERE = Path(__file__).resolve().parent
PACKAGE_README = HERE.parent / "README.md"
TOP_README = HERE.parent.parent.parent / "README.md"
README_ADDRESS = "127.0.0.1:50051"


def python_blocks(path: Path) -> List[str]:
    return re.findall(r"^```python\n(.*?)^```$", path.read_text(encoding="utf-8"), flags=re.S | re.M)


@dataclass
class Receipt:
    id: str
    declined: bool = False


@dataclass
class Psp:
    """A payment provider that records every charge."""

    charges: List[str] = field(default_factory=list)

    def charge(self, card: str, amount: int, **fence: Any) -> Receipt:
        self.charges.append(card)
        return Receipt(id="rcpt-" + card)


@dataclass
class Order:
    id: str
    card: str
    amount: int

    def as_dict(self) -> Dict[str, Any]:
        return {"id": self.id, "card": self.card, "amount": self.amount}


@dataclass
class User:
    id: str


@dataclass
class Mailer:
    sent: List[str] = field(default_factory=list)

    async def send(self, message: str, dedupe: int) -> None:
        self.sent.append(message)


@dataclass
class Stand:
    """What an example may use without defining it."""

    psp: Psp = field(default_factory=Psp)
    mailer: Mailer = field(default_factory=Mailer)
    replies: List[Any] = field(default_factory=list)
    copied: List[int] = field(default_factory=list)

    def namespace(self) -> Dict[str, Any]:
        tag = uuid.uuid4().hex
        return {
            "psp": self.psp,
            "order": Order(id="order-" + tag, card="card-" + tag, amount=1999),
            "user": User(id="user-" + tag),
            "mailer": self.mailer,
            "welcome_email": lambda user: "welcome " + user.id,
            "reply": lambda value, replayed=False: self.replies.append((value, replayed)),
            "pages": 3,
            "copy": lambda page, fence: self.copied.append(page),
        }


async def run_block(source: str, namespace: Dict[str, Any]) -> None:
    """Runs one block as a module would, top-level await allowed."""
    code = compile(source, "<README>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, namespace)
    if inspect.isawaitable(result):
        await result


def test_the_readmes_have_python_examples() -> None:
    assert len(python_blocks(PACKAGE_README)) >= 4
    assert len(python_blocks(TOP_README)) >= 1
    for block in python_blocks(PACKAGE_README)[:2] + python_blocks(TOP_README):
        assert README_ADDRESS in block


@pytest.mark.parametrize("readme", [PACKAGE_README, TOP_README], ids=["package", "top"])
def test_every_python_example_runs(server: Server, readme: Path) -> None:
    stand = Stand()
    address = f"127.0.0.1:{server.port}"

    async def main() -> None:
        with Client.connect(address) as client:
            async with AsyncClient.connect(address) as async_client:
                for block in python_blocks(readme):
                    namespace = stand.namespace()
                    namespace.update(client=client, async_client=async_client)
                    await run_block(block.replace(README_ADDRESS, address), namespace)
                    # Blocks that only define their work: run it once.
                    if "charge" in namespace and hasattr(namespace["charge"], "__wrapped__"):
                        assert namespace["charge"](namespace["order"]) == {"receipt": "rcpt-" + namespace["order"].card}
                    if "migrate" in namespace and "run_once" not in block:
                        client.run_once("readme.migrate", uuid.uuid4().hex, namespace["migrate"])

    asyncio.run(main())
    if readme == TOP_README:
        assert len(stand.psp.charges) == 1
        assert stand.replies == [({"receipt": "rcpt-" + stand.psp.charges[0]}, False)]
    else:
        assert len(stand.psp.charges) == 2  # the sync example and the decorator
        assert len(stand.mailer.sent) == 1  # the asyncio example
        assert stand.copied == [0, 1, 2]  # the long work, all its pages
