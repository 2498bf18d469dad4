"""valgrind_test.py - the daemon under valgrind (memcheck, definite leaks are errors): load,
status, a chat, a tokenize, protocol errors, an oversized line, a client leaving mid-stream, an
HTTP request, then SIGTERM; valgrind's exit status must be 0 (99 on any error).
"""
import json
import os
import shutil
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemonlib import Checks, Daemon  # noqa: E402

C = Checks("valgrind_test")


def main():
    if os.environ.get("TOASTED_SAN"):
        print("valgrind_test: not run against the ASan build (valgrind and ASan do not mix; `make test` runs it)")
        return 0
    if not shutil.which("valgrind"):
        print("valgrind_test: valgrind is missing (apt-get install valgrind)", file=sys.stderr)
        return 1
    vg = ["valgrind", "--error-exitcode=99", "--leak-check=full", "--errors-for-leak-kinds=definite", "--quiet",
          "--suppressions=" + os.path.join(os.path.dirname(os.path.abspath(__file__)), "valgrind.supp")]
    # the CPU backend: valgrind cannot follow a GPU, and probing for one dlopens the CUDA driver
    with Daemon(wrapper=vg, args=["--http", "127.0.0.1:0", "--threads", "1", "--backend", "cpu"], ready_timeout=300) as d:
        C.check(d.status()["protocol"] == 1, "status")
        ev = d.chat([{"role": "user", "content": "hi"}], temperature=0, max_tokens=3)
        C.check("done" in ev[-1], f"a chat: {ev[-1]}")
        ev = d.request({"v": 1, "id": "t", "type": "tokenize", "text": "héllo"})
        C.check("done" in ev[-1], "tokenize")
        for bad in (b"{oops\n", b'{"v":1,"id":"x","messages":[{"role":"nobody","content":""}]}\n', b"\xff\n"):
            s = d.connect(60)
            s.sendall(bad)
            C.check("error" in json.loads(s.makefile("rb").readline()), f"an error for {bad!r}")
            s.close()
        s = d.connect(60)
        try:
            s.sendall(b"x" * (9 << 20))
        except OSError:
            pass
        s.close()
        s = d.connect(120)
        s.sendall((json.dumps({"v": 1, "id": "gone", "messages": [{"role": "user", "content": "go on"}],
                               "max_tokens": 500}) + "\n").encode())
        f = s.makefile("rb")
        f.readline()
        f.close()
        s.close()
        port = int(d.status()["http"].rsplit(":", 1)[1])
        body = b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true}'
        h = socket.create_connection(("127.0.0.1", port), timeout=120)
        h.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        out = b""
        while b"[DONE]" not in out:
            b = h.recv(65536)
            if not b:
                break
            out += b
        h.close()
        C.check(b"[DONE]" in out, "an HTTP stream")
        t0 = time.time()
        while time.time() - t0 < 120 and d.status()["requests"]["running"]:
            time.sleep(0.1)
        d.signal(signal.SIGTERM)
        rc = d.wait(120)
        C.check(rc == 0, f"valgrind reports no error (exit {rc}): {d.stderr_text()[-4000:]}")
    return C.done()


if __name__ == "__main__":
    sys.exit(main())
