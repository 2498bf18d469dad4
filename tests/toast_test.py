"""toast_test.py - the toast client end to end against a daemon serving qwen3next-vocab:
`echo ... | toast "..."` prints exactly what `toasted run` prints for the same messages (greedy
and seeded sampling, system prompt, stop strings, invalid UTF-8 on stdin, a continued
conversation), the upstream greedy text of the chat fixtures comes through the daemon, -i,
--new, and the errors.

The daemon runs on the default backend: the GPU where there is one. There, two checks compare
different computations and hold only on the CPU, whose decode and prefill agree bit for bit: a
continued conversation (its first turn's state cached from decode) against the whole conversation
prefilled afresh, and the fixtures against the upstream float32 text. bf16 rounding moves a random
model's near-tied logits, so on the GPU the first checks the request instead (the whole
conversation went, the cached part was reused) and the second compares with `toasted run`; the
upstream comparison on the GPU, within tolerance, is `toasted check --backend cuda`
(bench/gpu.sh).
"""
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemonlib import BIN, VOCAB_MODEL, Checks, Daemon, need, run  # noqa: E402

C = Checks("toast_test")
TOAST = need(os.path.join(BIN, "toast"))
TOASTED = need(os.path.join(BIN, "toasted"))


def same(env, stdin, toast_args, run_args, what):
    t = run([TOAST] + toast_args, stdin, env)
    r = run([TOASTED, "run", VOCAB_MODEL] + run_args, stdin, env)
    C.check(t.returncode == 0 and r.returncode == 0, f"{what}: exit {t.returncode}/{r.returncode}: {t.stderr} {r.stderr}")
    C.check(t.stdout == r.stdout and len(t.stdout) > 0, f"{what}: toast {t.stdout[:300]!r} != run {r.stdout[:300]!r}")
    return t.stdout


def main():
    tmp = tempfile.mkdtemp(prefix="toast-test-")
    try:
        with Daemon() as d:
            env = dict(os.environ, TOASTED_SOCKET=d.sock, XDG_STATE_HOME=os.path.join(tmp, "state"))
            for k in ("TOAST_API_BASE", "TOAST_API_KEY", "TOAST_MODEL"):
                env.pop(k, None)
            g = ["--temperature", "0", "--max-tokens", "24"]
            backend = d.status().get("backend")
            C.check(backend in ("cpu", "cuda"), f"the daemon's backend: {backend!r}")
            exact = backend == "cpu"
            same(env, b"error: disk full at /var/log\n", ["what is wrong?"] + g, ["what is wrong?"] + g,
                 "stdin + prompt, greedy")
            same(env, b"", ["just a prompt"] + g, ["just a prompt"] + g, "prompt only")
            same(env, b"only material\n", g, g, "stdin only")
            same(env, b"bad \xff\xfe bytes \xc0\xaf\n", ["fix"] + g, ["fix"] + g, "invalid UTF-8 on stdin")
            same(env, b"x", ["-s", "You are terse.", "q"] + g, ["--system", "You are terse.", "q"] + g, "system prompt")
            s = ["--temperature", "0.9", "--seed", "5", "--top-k", "10", "--top-p", "0.95", "--min-p", "0.01",
                 "--repeat-penalty", "1.1", "--max-tokens", "16"]
            same(env, b"", ["sample"] + s, ["sample"] + s, "seeded sampling")
            same(env, b"", ["think", "--no-think"] + g, ["think", "--no-think"] + g, "--no-think")
            first = same(env, b"", ["stop here"] + g, ["stop here"] + g, "before a stop string")
            stop = first.decode(errors="replace")[6:9]
            if stop.strip():
                same(env, b"", ["stop here", "--stop", stop] + g, ["stop here", "--stop", stop] + g, "--stop")

            # a continued conversation is the history plus the new message, sent whole
            t1 = run([TOAST, "first question"] + g, b"", env)
            t2 = run([TOAST, "-c", "second question"] + g, b"", env)
            hist = os.path.join(tmp, "state", "toast", "conversation.jsonl")
            with open(hist) as f:
                msgs = [json.loads(l) for l in f]
            C.check([m["role"] for m in msgs] == ["user", "assistant", "user", "assistant"] and
                    msgs[1]["content"].encode() == t1.stdout and msgs[3]["content"].encode() == t2.stdout,
                    f"the history file keeps both turns: {msgs}")
            mf = os.path.join(tmp, "two.json")
            with open(mf, "w") as f:
                json.dump(msgs[:2], f)
            r = run([TOASTED, "run", VOCAB_MODEL, "second question", "--messages", mf, "--stats"] + g, b"", env)
            if exact:
                C.check(r.stdout == t2.stdout, f"-c sends the whole conversation: {t2.stdout!r} vs {r.stdout!r}")
            else:
                a = d.audit()[-1]
                n = r.stderr.decode(errors="replace").split("prompt: ")[-1].split(" tokens")[0]
                C.check(str(a.get("prompt_tokens")) == n and a.get("cached_tokens", 0) > 0,
                        f"-c sends the whole conversation ({n} tokens, the first turn cached): {a}")
            run([TOAST, "--new"], b"", env)
            C.check(not os.path.exists(hist), "--new forgets the conversation")

            # the upstream greedy continuations of the chat fixtures, through the daemon
            with open(os.path.join(VOCAB_MODEL, "chat-cases.json")) as f:
                cases = json.load(f)
            n = 0
            for c in cases:
                m = c["messages"]
                if c.get("template_kwargs") or len(m) > 2 or m[-1]["role"] != "user" or \
                        (len(m) == 2 and m[0]["role"] != "system"):
                    continue
                args = ["-s", m[0]["content"]] if len(m) == 2 else []
                q = ["--temperature", "0", "--max-tokens", "24", "--", m[-1]["content"]]
                t = run([TOAST] + args + q, b"", env)
                want = c["greedy_text"] if exact else \
                    run([TOASTED, "run", VOCAB_MODEL] + (["--system", m[0]["content"]] if args else []) + q,
                        b"", env).stdout.decode(errors="replace")
                C.check(t.stdout.decode(errors="replace") == want,
                        f"fixture {m[-1]['content'][:30]!r}: {t.stdout[:300]!r} != {want!r}")
                n += 1
            C.check(n >= 1, "at least one chat fixture compared")

            r = run([TOAST, "-i"] + g, b"hello there\nand again\n", env)
            with open(hist) as f:
                C.check(r.returncode == 0 and len(f.readlines()) == 4, f"-i: two turns kept: {r.stderr}")

            r = run([TOAST, "x", "--max-tokens", "9999999"], b"", env)
            C.check(r.returncode == 1 and b"context_length" in r.stderr, f"an error is on stderr, exit 1: {r.stderr}")
            r = run([TOAST, "--bogus"], b"", env)
            C.check(r.returncode == 2, "an unknown option is a usage error")
            r = run([TOAST, "x", "--draft", "8"], b"", env)
            C.check(r.returncode == 2, "--draft over 7 is a usage error")
            q = ["--temperature", "0", "--max-tokens", "12", "--", "say it again and again"]
            a, b = run([TOAST] + q, b"", env), run([TOAST, "--draft", "7"] + q, b"", env)
            C.check(a.returncode == 0 and b.returncode == 0 and a.stdout == b.stdout,
                    f"--draft 7: the greedy reply: {b.stdout!r} vs {a.stdout!r}")
            r = run([TOAST], b"", env)
            C.check(r.returncode == 2 and b"nothing to ask" in r.stderr, "nothing to ask")
        gone = dict(env, TOASTED_SOCKET=os.path.join(tmp, "none.sock"))
        r = run([TOAST, "hi"], b"", gone)
        C.check(r.returncode == 1 and b"toasted start" in r.stderr, f"no daemon, no provider: says how: {r.stderr}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return C.done()


if __name__ == "__main__":
    sys.exit(main())
