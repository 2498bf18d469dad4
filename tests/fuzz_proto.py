"""fuzz_proto.py - protocol fuzzing, bounded in time (FUZZ_SECONDS, default 6; FUZZ_SEED to
replay): random and mutated request lines on the Unix socket and mutated HTTP requests on the
loopback port. Every line the daemon sends must be a well-formed event, every request line must
get at most one terminal event, every HTTP reply must start with a status line, and the daemon
must keep serving.
"""
import json
import os
import random
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemonlib import Checks, Daemon, exchange  # noqa: E402

C = Checks("fuzz_proto")
SEEDS = [
    {"v": 1, "id": "c", "type": "chat", "messages": [{"role": "system", "content": "be brief"},
                                                      {"role": "user", "content": "héllo wörld 😀"}],
     "max_tokens": 3, "temperature": 0, "top_p": 0.9, "top_k": 5, "min_p": 0.05, "seed": 1, "stop": ["\n"],
     "stream": True},
    {"v": 1, "id": "n", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "stream": False},
    {"v": 1, "id": "s", "type": "status"},
    {"v": 1, "id": "t", "type": "tokenize", "text": "tokens, please"},
]
ODD = [None, True, False, -1, 0, 1, 2**63, -2**63, 1e308, -0.0, "", "x" * 300, [], {}, [1, [2, [3]]], {"a": None},
       "\u0000", "\ud7ff", "<|im_start|>", "\n"]


def mutate_json(rng):
    obj = json.loads(json.dumps(rng.choice(SEEDS)))
    for _ in range(rng.randint(1, 3)):
        target = obj
        msgs = obj.get("messages")
        if isinstance(msgs, list) and msgs and isinstance(msgs[0], dict) and rng.random() < 0.4:
            target = msgs[0]
        keys = list(target.keys()) + ["extra", "role", "content", "max_tokens", "stop", "v", "id", "type"]
        k = rng.choice(keys)
        if rng.random() < 0.2:
            target.pop(k, None)
        else:
            target[k] = rng.choice(ODD)
    return json.dumps(obj, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")


def mutate_bytes(rng, data):
    data = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(5)
        i = rng.randrange(len(data) + 1)
        if op == 0 and data:
            data[min(i, len(data) - 1)] = rng.randrange(256)
        elif op == 1:
            data[i:i] = bytes([rng.choice([0, 0xff, 0xc0, 0x80, ord('"'), ord('{'), ord('}'), ord('\\'), ord(','),
                                           ord('\n'), rng.randrange(256)])])
        elif op == 2:
            del data[i:i + rng.randint(1, 16)]
        elif op == 3:
            j = rng.randrange(len(data) + 1)
            data[i:i] = data[j:j + rng.randint(1, 32)]
        else:
            data = data[:i]
    return bytes(data)


def one_line(rng):
    r = rng.random()
    if r < 0.35:
        return mutate_json(rng)
    if r < 0.85:
        return mutate_bytes(rng, json.dumps(rng.choice(SEEDS)).encode())
    return bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))


def check_events(out, n_lines, what):
    terminal = 0
    for line in out.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            return C.check(False, f"{what}: not JSON: {line[:200]!r}")
        kinds = [k for k in ("delta", "done", "error") if k in ev]
        if not C.check(isinstance(ev, dict) and "id" in ev and len(kinds) == 1, f"{what}: not an event: {ev}"):
            return False
        terminal += kinds[0] != "delta"
    return C.check(terminal <= n_lines + 1, f"{what}: {terminal} terminal events for {n_lines} lines")


def fuzz_unix(d, rng, deadline):
    n = 0
    while time.time() < deadline:
        lines = [one_line(rng) for _ in range(rng.randint(1, 4))]
        payload = b"\n".join(lines) + (b"\n" if rng.random() < 0.9 else b"")
        try:
            out = exchange(d.connect(20), payload)
        except OSError as e:
            C.check(False, f"unix case {n}: {e} for {payload[:200]!r}; status {d.status()}; audit {d.audit()[-3:]}")
            break
        if not check_events(out, payload.count(b"\n") + 1, f"unix case {n} ({payload[:120]!r})"):
            break
        n += 1
    return n


def fuzz_http(d, port, rng, deadline):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    base = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body
    n = 0
    while time.time() < deadline:
        req = mutate_bytes(rng, base) if rng.random() < 0.8 else base.replace(body, mutate_json(rng))
        try:
            out = exchange(socket.create_connection(("127.0.0.1", port), timeout=20), req)
        except OSError as e:
            C.check(False, f"http case {n}: {e}")
            break
        if not C.check(out == b"" or out.startswith(b"HTTP/1.1 "), f"http case {n}: {out[:200]!r} for {req[:200]!r}"):
            break
        n += 1
    return n


def main():
    seed = int(os.environ.get("FUZZ_SEED", time.time_ns() % 1000000))
    secs = float(os.environ.get("FUZZ_SECONDS", "6"))
    print(f"fuzz_proto: seed {seed} (FUZZ_SEED={seed} replays), {secs} s")
    rng = random.Random(seed)
    # a request whose max_tokens was mutated away generates until the context is full: 96
    # tokens finish well within the 20 s a case may take under ASan on a busy 2-core machine
    with Daemon(args=["--http", "127.0.0.1:0", "--ctx-size", "96"]) as d:
        port = int(d.status()["http"].rsplit(":", 1)[1])
        n_unix = fuzz_unix(d, rng, time.time() + secs * 2 / 3)
        C.check(d.proc.poll() is None, "alive after the unix cases: " + d.stderr_text()[-2000:])
        n_http = fuzz_http(d, port, rng, time.time() + secs / 3)
        if not C.check(d.proc.poll() is None, f"the daemon is still running: {d.stderr_text()[-3000:]}"):
            return C.done()
        st = d.status()
        C.check(st["requests"]["rejected"] > 0, "malformed requests were rejected")
        print(f"fuzz_proto: {n_unix} unix cases, {n_http} http cases; {st['requests']}")
    return C.done()


if __name__ == "__main__":
    sys.exit(main())
