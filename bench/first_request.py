"""first_request.py - how long `toasted start` takes and what the first requests to the daemon cost
(the audit record's ttft_ms and total_ms), on the default backend: the GPU where there is one.
`toast` must feel instant from the first request on, not from the second.

Usage: python3 bench/first_request.py MODEL [MODEL ...]   (TOASTED_BIN as for the tests)
Each model, twice: a daemon started (timed until it serves), then five chat requests of 8 tokens,
different each time (the session cache cannot answer them), one after the other; greedy, then
(a new daemon) with the default sampling (temperature 0.7, top-k 20: the largest logits only).
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from daemonlib import Daemon  # noqa: E402

QUESTIONS = ["What is the capital of France?", "Name a prime number.", "Say hello.",
             "What colour is the sky?", "Count to three."]


def first_requests(model, greedy):
    t0 = time.monotonic()
    with Daemon(model=model, ready_timeout=300) as d:
        ready = time.monotonic() - t0
        st = d.status()
        print(f"{os.path.basename(model.rstrip('/'))} ({st.get('backend')}, {'greedy' if greedy else 'sampled'}): "
              f"serving {ready:.2f} s after start")
        for i, q in enumerate(QUESTIONS):
            t = time.monotonic()
            d.chat([{"role": "user", "content": q}], max_tokens=8, **({"temperature": 0} if greedy else {}))
            wall = time.monotonic() - t
            a = d.audit()[-1]
            print(f"  request {i + 1}: ttft {a.get('ttft_ms', 0):8.1f} ms, total {a.get('total_ms', 0):8.1f} ms, "
                  f"client {wall * 1e3:8.1f} ms, prompt {a.get('prompt_tokens')} tokens")


def main():
    for model in sys.argv[1:]:
        for greedy in (True, False):
            first_requests(model, greedy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
