"""openai_test.py - the OpenAI-compatible HTTP API (`toasted start --http 127.0.0.1:PORT`) driven
by the official `openai` Python client: GET /v1/models, non-streaming and streaming chat
completions (the same text as the Unix-socket protocol, greedy), errors as APIError, and a few
raw-HTTP edge cases (a foreign Host, a wrong Content-Type, an unknown path, a huge body).

Run with a Python that has `openai` installed (.ci/run makes build/venv); it fails without it.
"""
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemonlib import Checks, Daemon, exchange, text_of  # noqa: E402

C = Checks("openai_test")
try:
    import openai
except ImportError:
    print("openai_test: the `openai` package is missing (python3 -m venv build/venv && "
          "build/venv/bin/pip install openai)", file=sys.stderr)
    sys.exit(1)


def raw(port, data):
    return exchange(socket.create_connection(("127.0.0.1", port), timeout=20), data, shut=False)


def main():
    with Daemon(args=["--http", "127.0.0.1:0"]) as d:
        port = int(d.status()["http"].rsplit(":", 1)[1])
        cl = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)
        models = cl.models.list()
        C.check([m.id for m in models.data] == ["qwen3next-vocab"], f"models: {models}")
        msgs = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a colour."}]
        want = text_of(d.chat(msgs, temperature=0, max_tokens=16))
        r = cl.chat.completions.create(model="qwen3next-vocab", messages=msgs, temperature=0, max_tokens=16)
        C.check(r.choices[0].message.content == want and r.choices[0].message.role == "assistant",
                f"non-streaming: {r.choices[0].message.content!r} vs {want!r}")
        C.check(r.object == "chat.completion" and r.choices[0].finish_reason in ("stop", "length") and
                r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0, f"non-streaming fields: {r}")
        parts, finish, chunks = [], None, 0
        for ch in cl.chat.completions.create(model="x", messages=msgs, temperature=0, max_tokens=16, stream=True):
            chunks += 1
            if ch.choices and ch.choices[0].delta.content:
                parts.append(ch.choices[0].delta.content)
            if ch.choices and ch.choices[0].finish_reason:
                finish = ch.choices[0].finish_reason
        C.check("".join(parts) == want and finish in ("stop", "length") and chunks >= 3,
                f"streaming: {''.join(parts)!r} vs {want!r}, finish {finish}, {chunks} chunks")
        r = cl.chat.completions.create(model="x", messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                                       max_tokens=4, seed=3, top_p=0.9, stop=["\n\n"])
        C.check(r.usage.completion_tokens <= 4, f"content parts, seed, top_p, stop: {r}")
        try:
            cl.chat.completions.create(model="x", messages=[{"role": "wizard", "content": "x"}])
            C.check(False, "an unknown role must fail")
        except openai.BadRequestError as e:
            C.check("role" in str(e), f"a 400 with the reason: {e}")
        try:
            cl.chat.completions.create(model="x", messages=msgs, max_tokens=10**6)
            C.check(False, "max_tokens past the context must fail")
        except openai.APIStatusError as e:
            C.check(e.status_code in (400, 413), f"max_tokens past the context: {e.status_code} {e}")

        host = b"Host: 127.0.0.1\r\n"
        body = b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
        out = raw(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: evil.example\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        C.check(out.startswith(b"HTTP/1.1 403"), f"a foreign Host is refused (DNS rebinding): {out[:80]}")
        out = raw(port, b"POST /v1/chat/completions HTTP/1.1\r\n" + host + b"Content-Type: text/plain\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        C.check(out.startswith(b"HTTP/1.1 415"), f"a simple (form/text) POST is refused: {out[:80]}")
        C.check(raw(port, b"GET /nope HTTP/1.1\r\n" + host + b"\r\n").startswith(b"HTTP/1.1 404"), "an unknown path")
        out = raw(port, b"POST /v1/chat/completions HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\n"
                  b"Content-Length: 999999999\r\n\r\n" + b"x" * 1000)
        C.check(out.startswith(b"HTTP/1.1 413"), f"a huge body is refused before it is read: {out[:80]}")
        out = raw(port, b"GET /v1/models HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 20000 + b"\r\n\r\n")
        C.check(out.startswith(b"HTTP/1.1 431"), f"a huge head: {out[:80]}")
        # a client that leaves mid-stream cancels its generation
        body = (b'{"messages":[{"role":"user","content":"Tell a long story."}],"max_tokens":3000,'
                b'"temperature":1,"stream":true}')
        s = socket.create_connection(("127.0.0.1", port), timeout=20)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        got = b""
        while got.count(b"data: ") < 3:
            got += s.recv(65536)
        s.close()
        import time
        t0 = time.time()
        while time.time() - t0 < 20 and d.status()["requests"]["running"]:
            time.sleep(0.05)
        a = [x for x in d.audit() if x.get("via") == "http" and x.get("outcome") == "cancelled"]
        C.check(len(a) == 1 and a[0]["completion_tokens"] < 3000, f"an HTTP client that leaves cancels: {a}")
        C.check(d.alive(), "the daemon still serves")
        a = [x for x in d.audit() if x.get("via") == "http" and x.get("type") == "chat"]
        C.check(len(a) >= 3 and all(x["uid"] == -1 for x in a), f"HTTP requests are audited: {len(a)}")
    return C.done()


if __name__ == "__main__":
    sys.exit(main())
