#!/bin/sh
# Run every test binary in $BUILD/tests and every tests/*.sh script; fail if any fails.
# A test that needs a fixture fails when it is missing (never skips). Each test's seconds are
# printed after it (CI must stay under 20 minutes: docs/PERF.md, "CI time").
set -u
BUILD=${BUILD:-build}
export TOASTED_TESTDATA=${TOASTED_TESTDATA:-$BUILD/testdata}
export TOASTED_BIN=${TOASTED_BIN:-$BUILD}
fail=0
# run_test NAME CMD...: run it, fail the suite when it fails, print its seconds
run_test() {
	name=$1
	shift
	t0=$(date +%s)
	if ! "$@"; then
		echo "FAILED: $name" >&2
		fail=1
	fi
	echo "${name##*/}: $(($(date +%s) - t0)) s"
}
for t in "$BUILD"/tests/test_*; do
	[ -x "$t" ] || continue
	case "$t" in *.o|*.d) continue ;; esac
	case " ${TOASTED_SAN_SKIP:-} " in *" ${t##*/} "*)
		echo "${t##*/}: left out of this sanitizer run (TOASTED_SAN_SKIP)"
		continue ;;
	esac
	run_test "$t" "$t"
done
for t in tests/*.sh; do
	[ "$t" = tests/run.sh ] && continue
	[ -f "$t" ] || continue
	run_test "$t" sh "$t"
done
[ $fail = 0 ] && echo "all tests passed"
exit $fail
