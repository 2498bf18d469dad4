"""daemonlib.py - helpers for the daemon tests: start `toasted start --foreground` on a private
socket in a temporary directory (always killed at the end), talk the line protocol, check things.

Environment: TOASTED_BIN (directory of toasted and toast, default build), TOASTED_TESTDATA
(default build/testdata). A missing binary or fixture is a failure, never a skip.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

BIN = os.environ.get("TOASTED_BIN", "build")
DATA = os.environ.get("TOASTED_TESTDATA", "build/testdata")
VOCAB_MODEL = os.path.join(DATA, "models", "qwen3next-vocab")


class Checks:
    def __init__(self, name):
        self.name, self.n, self.failed = name, 0, 0

    def check(self, cond, msg):
        self.n += 1
        if not cond:
            self.failed += 1
            print(f"{self.name}: FAILED: {msg}", file=sys.stderr, flush=True)
        return cond

    def done(self):
        if self.failed:
            print(f"{self.name}: {self.failed} of {self.n} checks FAILED", file=sys.stderr)
            return 1
        print(f"{self.name}: {self.n} checks OK")
        return 0


def need(path):
    if not os.path.exists(path):
        print(f"missing {path} (run `make` and `make testdata`)", file=sys.stderr)
        sys.exit(1)
    return path


class Daemon:
    """A daemon on its own socket; use as a context manager so it is always killed."""

    def __init__(self, model=VOCAB_MODEL, args=(), env=None, wrapper=(), ready_timeout=60):
        need(os.path.join(BIN, "toasted"))
        need(model)
        self.dir = tempfile.mkdtemp(prefix="toasted-test-")
        self.sock = os.path.join(self.dir, "d.sock")
        self.log = os.path.join(self.dir, "d.log")
        self.env = dict(os.environ, **(env or {}))
        self.env.pop("TOASTED_SOCKET", None)
        cmd = list(wrapper) + [os.path.join(BIN, "toasted"), "start", model, "--foreground", "--socket", self.sock,
                               "--log", self.log] + list(args)
        self.stderr = open(os.path.join(self.dir, "stderr"), "wb")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.stderr, stderr=self.stderr, env=self.env)
        t0 = time.time()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited ({self.proc.returncode}) while starting: {self.stderr_text()}")
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect(self.sock)
                s.close()
                break
            except OSError:
                if time.time() - t0 > ready_timeout:
                    self.kill()
                    raise RuntimeError("daemon not ready in time: " + self.stderr_text())
                time.sleep(0.02)

    def stderr_text(self):
        with open(os.path.join(self.dir, "stderr"), "rb") as f:
            return f.read().decode(errors="replace")

    def log_lines(self):
        try:
            with open(self.log) as f:
                return [json.loads(l) for l in f if l.strip()]
        except FileNotFoundError:
            return []

    def audit(self):
        return [l for l in self.log_lines() if l.get("event") == "request"]

    def connect(self, timeout=30):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(timeout)
        s.connect(self.sock)
        return s

    def request(self, obj, timeout=60):
        """Send one request on a new connection; return its events (through done/error)."""
        s = self.connect(timeout)
        try:
            s.sendall((json.dumps(obj) + "\n").encode())
            return read_events(s)
        finally:
            s.close()

    def chat(self, messages, **kw):
        req = {"v": 1, "id": kw.pop("id", "c"), "type": "chat", "messages": messages}
        req.update(kw)
        return self.request(req)

    def status(self):
        ev = self.request({"v": 1, "id": "st", "type": "status"})
        return ev[-1]["done"]["status"]

    def alive(self, within=3.0):
        """The daemon answers status within `within` seconds (connections just dropped may still
        hold their slots until the loop thread has closed them)."""
        deadline = time.monotonic() + within
        while True:
            try:
                return self.status()["protocol"] == 1
            except Exception as e:  # noqa: BLE001 - any failure means not serving
                if time.monotonic() >= deadline:
                    print(f"status failed: {e}", file=sys.stderr)
                    return False
                time.sleep(0.05)

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
        self.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def read_events(s):
    """Read event lines until a done or error event, or the end of the stream."""
    f = s.makefile("rb")
    events = []
    for line in f:
        ev = json.loads(line)
        events.append(ev)
        if "done" in ev or "error" in ev:
            break
    return events


def exchange(s, data, shut=True):
    """Send data (then half-close) on socket s and read until the peer closes; a reset ends it."""
    out = b""
    try:
        s.sendall(data)
        if shut:
            s.shutdown(socket.SHUT_WR)
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except ConnectionResetError:
        pass
    finally:
        s.close()
    return out


def text_of(events):
    out = "".join(e.get("delta", "") for e in events)
    if events and "done" in events[-1] and "text" in events[-1]["done"]:
        out += events[-1]["done"]["text"]
    return out


def run(cmd, stdin=b"", env=None, timeout=120):
    return subprocess.run(cmd, input=stdin, capture_output=True, env=env, timeout=timeout)
