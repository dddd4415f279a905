"""A real coordinator on a database of its own, for the tests and the
benchmark. Nothing here is mocked: the server binary runs on PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import IO, List, Optional, Sequence
from urllib.parse import urlsplit, urlunsplit

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/postgres"


def server_binary() -> str:
    return os.environ.get(
        "IDEMPOTENCY_COORDINATOR_BIN",
        str(REPO_ROOT / "target" / "debug" / "idempotency-coordinator"),
    )


class Database:
    """``CREATE DATABASE`` on entry, ``DROP DATABASE ... WITH (FORCE)`` on close."""

    def __init__(self, prefix: str = "idem_py") -> None:
        self.admin_url = os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
        self.name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        parts = urlsplit(self.admin_url)
        self.url = urlunsplit(parts._replace(path="/" + self.name))
        self._psql(f'CREATE DATABASE "{self.name}"')

    def _psql(self, sql: str) -> None:
        subprocess.run(
            ["psql", "-v", "ON_ERROR_STOP=1", "-q", "-d", self.admin_url, "-c", sql],
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def drop(self) -> None:
        self._psql(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


class Server:
    """The coordinator binary, serving ``database_url`` on a free port."""

    def __init__(self, database_url: str, extra_args: Sequence[str] = (), start_timeout: float = 60.0) -> None:
        cmd = [
            server_binary(),
            "--log-format",
            "json",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            database_url,
            *extra_args,
        ]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.addr: Optional[str] = None
        self.lines: List[str] = []
        self._listening = threading.Event()
        self._ready = threading.Event()
        assert self.proc.stderr is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stderr,), daemon=True)
        self._reader.start()
        deadline = time.monotonic() + start_timeout
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("coordinator did not become ready:\n" + "\n".join(self.lines[-30:]))
        assert self.addr is not None

    @property
    def port(self) -> int:
        assert self.addr is not None
        return int(self.addr.rsplit(":", 1)[1])

    def _read(self, stream: IO[bytes]) -> None:
        # Read to the end so that the pipe never fills.
        for raw in stream:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if len(self.lines) < 2000:
                self.lines.append(line)
            try:
                fields = json.loads(line).get("fields", {})
            except ValueError:
                continue
            msg = fields.get("message")
            if msg == "listening" and self.addr is None:
                self.addr = fields.get("addr")
                self._listening.set()
            elif msg == "database ready":
                self._ready.set()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
