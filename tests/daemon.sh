#!/bin/sh
# The daemon and client suites (Python 3, standard library; the OpenAI-client test uses the venv
# .ci/run makes, TOASTED_VENV, default build/venv). Each suite starts its daemons on private
# sockets in temporary directories and kills them. Missing pieces fail, never skip.
set -u
py=python3
venv=${TOASTED_VENV:-build/venv}
fail=0
for t in daemon_test cache_test fuzz_proto toast_test provider_test valgrind_test; do
	$py "tests/$t.py" || { echo "FAILED: tests/$t.py" >&2; fail=1; }
done
if [ -x "$venv/bin/python" ]; then
	"$venv/bin/python" tests/openai_test.py || { echo "FAILED: tests/openai_test.py" >&2; fail=1; }
else
	echo "FAILED: tests/openai_test.py needs $venv with openai (python3 -m venv $venv && $venv/bin/pip install openai)" >&2
	fail=1
fi
exit $fail
