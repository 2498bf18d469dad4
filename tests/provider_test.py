"""provider_test.py - toast without a daemon, against an OpenAI-compatible provider
(TOAST_API_BASE, TOAST_API_KEY, TOAST_MODEL): a stand-in server on loopback (http.server,
in this process) streams server-sent events; toast must print the same text it streams, send the
composed conversation and the sampling options, keep the history for -c, and report errors.
"""
import http.server
import json
import os
import shutil
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemonlib import BIN, Checks, need, run  # noqa: E402

C = Checks("provider_test")
TOAST = need(os.path.join(BIN, "toast"))
REQUESTS = []


def answer_for(body):
    return "Echo « " + body["messages"][-1]["content"][::-1] + " » done."


class Stub(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def reply_error(self, code, msg):
        data = json.dumps({"error": {"message": msg, "type": "invalid_request_error"}}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        REQUESTS.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        if self.path != "/v1/chat/completions":
            return self.reply_error(404, "no such path")
        if self.headers.get("Authorization") != "Bearer test-key":
            return self.reply_error(401, "Incorrect API key provided")
        if body.get("model") != "stub-model":
            return self.reply_error(404, "no such model")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        text = answer_for(body)

        def send(obj):
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            self.wfile.flush()

        send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        self.wfile.write(b": a comment line\n\n")
        for i in range(0, len(text), 3):
            send({"choices": [{"index": 0, "delta": {"content": text[i:i + 3]}, "finish_reason": None}]})
            if "fail-midway" in body["messages"][-1]["content"] and i > 6:
                send({"error": {"message": "the provider is overloaded"}})
                return
        send({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        self.wfile.write(b"data: [DONE]\n\n")


def main():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    tmp = tempfile.mkdtemp(prefix="toast-provider-")
    try:
        env = dict(os.environ, TOASTED_SOCKET=os.path.join(tmp, "no-daemon.sock"),
                   XDG_STATE_HOME=os.path.join(tmp, "state"), TOAST_API_KEY="test-key", TOAST_MODEL="stub-model",
                   TOAST_API_BASE=f"http://127.0.0.1:{srv.server_port}/v1/")
        r = run([TOAST, "what is this?", "--temperature", "0.5", "--max-tokens", "7", "--stop", "END"],
                "log line ü\n".encode(), env)
        want = answer_for({"messages": [{"content": "what is this?\n\nlog line ü\n"}]})
        C.check(r.returncode == 0 and r.stdout.decode() == want, f"toast prints the stream: {r.stdout!r} {r.stderr!r}")
        b = REQUESTS[-1]["body"] if REQUESTS else {}
        C.check(REQUESTS and REQUESTS[-1]["path"] == "/v1/chat/completions", "POST {base}/chat/completions")
        C.check(b.get("messages") == [{"role": "user", "content": "what is this?\n\nlog line ü\n"}] and
                b.get("stream") is True and b.get("temperature") == 0.5 and b.get("max_tokens") == 7 and
                b.get("stop") == ["END"] and "top_k" not in b and "min_p" not in b, f"the request: {b}")
        r = run([TOAST, "-c", "and then?", "-s", "be kind"], b"", env)
        b = REQUESTS[-1]["body"]
        C.check(r.returncode == 0 and [m["role"] for m in b["messages"]] == ["system", "user", "assistant", "user"] and
                b["messages"][2]["content"] == want, f"-c sends the history to the provider: {b['messages']}")
        r = run([TOAST, "hi"], b"", dict(env, TOAST_API_KEY="wrong"))
        C.check(r.returncode == 1 and b"401" in r.stderr and b"Incorrect API key" in r.stderr,
                f"a refused key: {r.stderr}")
        r = run([TOAST, "please fail-midway now"], b"", env)
        C.check(r.returncode == 1 and b"overloaded" in r.stderr and len(r.stdout) > 0,
                f"an error mid-stream: {r.stdout!r} {r.stderr!r}")
        r = run([TOAST, "hi"], b"", {k: v for k, v in env.items() if k != "TOAST_MODEL"})
        C.check(r.returncode == 1 and b"TOAST_MODEL" in r.stderr, f"no model named: {r.stderr}")
        r = run([TOAST, "hi"], b"", dict(env, TOAST_API_BASE="http://127.0.0.1:1/v1"))
        C.check(r.returncode == 1 and b"127.0.0.1:1" in r.stderr, f"an unreachable provider: {r.stderr}")
    finally:
        srv.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    return C.done()


if __name__ == "__main__":
    sys.exit(main())
