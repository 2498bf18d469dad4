#!/bin/sh
# The daemon and client suites (Python 3, standard library; the OpenAI-client test uses a venv,
# TOASTED_VENV, default build/venv, made here when missing). Each suite starts its daemons on private
# sockets in temporary directories and kills them. Missing pieces fail, never skip.
set -u
py=python3
venv=${TOASTED_VENV:-build/venv}
fail=0
for t in daemon_test cache_test fuzz_proto toast_test provider_test valgrind_test; do
	$py "tests/$t.py" || { echo "FAILED: tests/$t.py" >&2; fail=1; }
done
# the OpenAI-compatible API against the official client, from PyPI into a venv made once
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import openai' 2>/dev/null; then
	python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check "openai==3.54.0" >/dev/null
fi
"$venv/bin/python" tests/openai_test.py || { echo "FAILED: tests/openai_test.py (client in $venv)" >&2; fail=1; }
exit $fail
