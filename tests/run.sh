#!/bin/sh
# Run every test binary in $BUILD/tests and every tests/*.sh script; fail if any fails.
# A test that needs a fixture fails when it is missing (never skips). Each test's seconds are
# printed after it (CI must stay under 20 minutes: docs/PERF.md, "CI time").
set -u
BUILD=${BUILD:-build}
export TOASTED_TESTDATA=${TOASTED_TESTDATA:-$BUILD/testdata}
export TOASTED_BIN=${TOASTED_BIN:-$BUILD}
fail=0
for t in "$BUILD"/tests/test_*; do
	[ -x "$t" ] || continue
	case "$t" in *.o|*.d) continue ;; esac
	case " ${TOASTED_SAN_SKIP:-} " in *" ${t##*/} "*)
		echo "${t##*/}: left out of this sanitizer run (TOASTED_SAN_SKIP)"
		continue ;;
	esac
	t0=$(date +%s)
	if ! "$t"; then
		echo "FAILED: $t" >&2
		fail=1
	fi
	echo "${t##*/}: $(($(date +%s) - t0)) s"
done
for t in tests/*.sh; do
	[ "$t" = tests/run.sh ] && continue
	[ -f "$t" ] || continue
	t0=$(date +%s)
	if ! sh "$t"; then
		echo "FAILED: $t" >&2
		fail=1
	fi
	echo "${t##*/}: $(($(date +%s) - t0)) s"
done
[ $fail = 0 ] && echo "all tests passed"
exit $fail
