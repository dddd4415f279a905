#!/usr/bin/env python3
"""docs/n8n's workflows, as docs/http.md builds them, run in a real n8n
against the real coordinator: the happy path (ten parallel executions of
one order charge it once), the failure path (an upstream's 500 with a JSON
body is reported FAILED and backs off, instead of holding the lock for the
whole lease) and the service-down path (a coordinator that refuses
connections reaches the workflow's Down branch).

    python3 tests/n8n/run.py N8N_BIN COORDINATOR_BIN DATABASE_URL

N8N_BIN is n8n's launcher (`.ci/n8n` installs one); COORDINATOR_BIN the
server binary. Prints one line per check and `N passed, N failed` last;
exits 1 on any failure.
"""

import concurrent.futures
import http.server
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / "docs" / "n8n"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, timeout=60):
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, parse(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, parse(e.read())


def served(answer):
    """Whether `post`'s answer came from a running workflow: while n8n
    starts it answers every path 200 "n8n is starting up. Please wait"."""
    status, body = answer
    return status == 200 and "n8n is starting up" not in str(body)


def parse(data):
    try:
        return json.loads(data or b"null")
    except ValueError:
        return data.decode(errors="replace")


def wait_until(what, condition, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{what}: not within {seconds} s")


class Shop(http.server.ThreadingHTTPServer):
    """The business step's upstream: counts what it was asked, by path and
    order, and answers 500 with a JSON body (quotes in its message) when
    asked to fail."""

    def __init__(self):
        self.seen = {}
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", free_port()), ShopHandler)


class ShopHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"] or 0)) or b"{}")
        with self.server.lock:
            name = (self.path, body.get("order"))
            self.server.seen[name] = self.server.seen.get(name, 0) + 1
        fail = body.get("fail") is True
        answer = {"error": 'card "declined" by the issuer'} if fail else {"charged": True}
        data = json.dumps(answer).encode()
        self.send_response(500 if fail else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def start(argv, log, env=None):
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)


def workflows(work, coordinator, shop):
    """The docs' workflows with the hosts of this run in place of the
    docs' service names."""
    paths = []
    for source in sorted(WORKFLOWS.glob("*.json")):
        text = source.read_text()
        text = text.replace("http://idempotency-coordinator:8080", coordinator)
        text = text.replace("http://shop:8000", shop)
        target = work / source.name
        target.write_text(text)
        paths.append(target)
    return paths


def n8n_env(work, port):
    env = dict(os.environ)
    env.update(
        N8N_USER_FOLDER=str(work / "n8n"),
        N8N_PORT=str(port),
        N8N_LISTEN_ADDRESS="127.0.0.1",
        N8N_DIAGNOSTICS_ENABLED="false",
        N8N_VERSION_NOTIFICATIONS_ENABLED="false",
        N8N_TEMPLATES_ENABLED="false",
        N8N_PERSONALIZATION_ENABLED="false",
        N8N_RUNNERS_ENABLED="false",
        N8N_SECURE_COOKIE="false",
        N8N_ENFORCE_SETTINGS_FILE_PERMISSIONS="false",
        N8N_LOG_LEVEL="warn",
        DB_TYPE="sqlite",
        EXECUTIONS_MODE="regular",
        GENERIC_TIMEZONE="UTC",
    )
    return env


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def run(self, name, check):
        try:
            check()
        except Exception as e:  # one check's failure must not hide the others
            self.failed += 1
            print(f"FAIL {name}: {e}")
        else:
            self.passed += 1
            print(f"ok   {name}")


def main():
    n8n, server, database_url = sys.argv[1:4]
    work = pathlib.Path(tempfile.mkdtemp(prefix="n8n-suite-"))
    processes = []
    shop = Shop()
    threading.Thread(target=shop.serve_forever, daemon=True).start()
    shop_url = f"http://127.0.0.1:{shop.server_address[1]}"
    http_port, grpc_port, n8n_port = free_port(), free_port(), free_port()
    coordinator_url = f"http://127.0.0.1:{http_port}"
    try:
        log = open(work / "coordinator.log", "w")
        processes.append(
            start(
                [server, "serve", "--database-url", database_url,
                 "--listen", f"127.0.0.1:{grpc_port}", "--http-listen", f"127.0.0.1:{http_port}"],
                log,
            )
        )
        wait_until("the coordinator", lambda: urllib.request.urlopen(coordinator_url + "/health").status == 200)

        env = n8n_env(work, n8n_port)
        for path in workflows(work, coordinator_url, shop_url):
            subprocess.run([n8n, "import:workflow", f"--input={path}"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            workflow_id = json.loads(path.read_text())["id"]
            subprocess.run([n8n, "publish:workflow", f"--id={workflow_id}"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
        n8n_log = open(work / "n8n.log", "w")
        processes.append(start([n8n, "start"], n8n_log, env))
        hooks = f"http://127.0.0.1:{n8n_port}/webhook"
        wait_until("n8n", lambda: urllib.request.urlopen(f"http://127.0.0.1:{n8n_port}/healthz").status == 200, 180)
        # n8n registers each published workflow's webhook as it activates
        # it, one after another: wait for both (a warm-up order charges
        # a key of its own).
        wait_until("n8n's webhooks", lambda: served(post(f"{hooks}/coordinator-health", {})), 120)
        warm_up = {"unique_id": f"warm-up-{time.time_ns()}"}
        wait_until("n8n's order webhook", lambda: served(post(f"{hooks}/orders", warm_up)), 120)

        checks = Checks()
        checks.run("ten parallel executions of one order charge it once",
                   lambda: happy(hooks, coordinator_url, shop))
        checks.run("a failed charge is reported FAILED and backs off, not locked for the lease",
                   lambda: failure(hooks, coordinator_url, shop))
        checks.run("the health workflow takes its Up branch while the coordinator serves",
                   lambda: health(hooks, shop, "/up"))
        processes[0].terminate()
        processes[0].wait(30)
        checks.run("the health workflow takes its Down branch when the coordinator is down",
                   lambda: health(hooks, shop, "/down"))
        print(f"{checks.passed} passed, {checks.failed} failed")
        if checks.failed:
            for name in ("coordinator.log", "n8n.log"):
                sys.stderr.write(f"--- {name}\n{(work / name).read_text()[-4000:]}\n")
        return 1 if checks.failed else 0
    except Exception:
        for name in ("coordinator.log", "n8n.log"):
            if (work / name).exists():
                sys.stderr.write(f"--- {name}\n{(work / name).read_text()[-4000:]}\n")
        raise
    finally:
        for process in reversed(processes):
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        shop.shutdown()
        shutil.rmtree(work, ignore_errors=True)


def happy(hooks, coordinator, shop):
    order = f"order-{time.time_ns()}"
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(lambda _: post(f"{hooks}/orders", {"unique_id": order}), range(10)))
    assert all(status == 200 for status, _ in answers), answers
    # Executions that met the lock held answered RETRY_LATER; a later one
    # finds the key done.
    status, again = post(f"{hooks}/orders", {"unique_id": order})
    assert status == 200, again
    charged = shop.seen.get(("/charge", order), 0)
    assert charged == 1, f"the order was charged {charged} times"
    status, decided = post(f"{coordinator}/acquire", {"scope": "orders_charge", "idempotency_key": order})
    assert decided.get("decision") == "SKIP_ALREADY_DONE", decided


def failure(hooks, coordinator, shop):
    order = f"order-{time.time_ns()}"
    post(f"{hooks}/orders", {"unique_id": order, "fail": True})
    assert shop.seen.get(("/charge", order)) == 1, "the charge did not run"
    status, decided = post(f"{coordinator}/acquire", {"scope": "orders_charge", "idempotency_key": order})
    # RETRY_LATER because a failure's retry is not due, not because a
    # lease is held.
    assert decided.get("decision") == "RETRY_LATER", decided
    assert decided.get("coordinator_decision") == "RETRY_LATER", decided
    # The first attempt's failure waits 120 s (base 60 × 2¹), not the
    # 900 s lease a lost /complete would leave behind.
    assert 0 < decided.get("retry_after_seconds", 0) <= 120, decided
    assert "declined" in decided.get("last_error", ""), decided


def health(hooks, shop, branch):
    before = shop.seen.get((branch, None), 0)
    post(f"{hooks}/coordinator-health", {})
    after = shop.seen.get((branch, None), 0)
    assert after == before + 1, f"{branch} was not reached ({shop.seen})"


if __name__ == "__main__":
    sys.exit(main())
