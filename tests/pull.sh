#!/bin/sh
# tests/pull.sh - `toasted pull` and `toasted publish` end to end, against an rsync daemon that
# this script starts on loopback (a free port, a temporary rsyncd.conf; killed on exit, whatever
# happens). No network beyond 127.0.0.1. The pulled model is the qwen3-tiny fixture plus a 4 MiB
# random shard, so `toasted check` on the result proves the files are the model's.
#
# Cases: publish (against coreutils sha256sum), fresh pull, pull by NAME into the default DEST,
# interrupted pulls resumed (SIGTERM: rsync's partial file; SIGKILL of everything: the temporary
# file kept aside), an update of one file, a corrupted source and a corrupted local file caught
# by the manifest, a full disk, bad sources and destinations, a local directory SOURCE.
set -u
BIN=${TOASTED_BIN:-build}/toasted
DATA=${TOASTED_TESTDATA:-build/testdata}
FIXTURE=$DATA/models/qwen3-tiny
fails=0
checks=0
T=$(mktemp -d "${TMPDIR:-/tmp}/toasted-pull-test.XXXXXX")
DPID=

cleanup() {
	[ -n "$DPID" ] && kill "$DPID" 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

fail() {
	echo "pull.sh: FAIL: $*" >&2
	fails=$((fails + 1))
}
check() { # check DESCRIPTION COMMAND... : the command must succeed
	checks=$((checks + 1))
	d=$1
	shift
	"$@" || fail "$d"
}
# run toasted, keeping its exit status in rc, stdout in $T/out, stderr in $T/err; te runs it
# under env with VAR=VALUE arguments first
t() {
	"$BIN" "$@" >"$T/out" 2>"$T/err"
	rc=$?
	sanitizer_clean
}
te() {
	env "$@" >"$T/out" 2>"$T/err"
	rc=$?
	sanitizer_clean
}
# under a sanitizer build (TOASTED_BIN=build-debug) an error path must not leak or misbehave either
sanitizer_clean() {
	if grep -q "Sanitizer" "$T/err"; then
		fail "sanitizer report: $(grep -m3 Sanitizer "$T/err")"
	fi
}
expect_ok() {
	checks=$((checks + 1))
	[ "$rc" = 0 ] || fail "$1: exit $rc: $(cat "$T/err")"
}
expect_err() { # expect_err DESCRIPTION TEXT: non-zero exit and TEXT in stderr
	checks=$((checks + 1))
	if [ "$rc" = 0 ]; then
		fail "$1: succeeded, expected an error containing \"$2\""
	elif ! grep -qF -- "$2" "$T/err"; then
		fail "$1: expected \"$2\" in: $(cat "$T/err")"
	fi
}
received() { sed -n 's/.*received \([0-9]*\) bytes.*/\1/p' "$T/out"; }
transferred() { sed -n 's/.*transferred \([0-9]*\) file.*/\1/p' "$T/out"; }
fsize() { wc -c <"$1" | tr -d ' '; }
same_tree() { diff -r -x '.*' "$1" "$2" >/dev/null; }
complete() { [ -f "$1/SHA256SUMS" ] && [ ! -e "$1/.toasted-pull-incomplete" ] && [ ! -e "$1/.toasted-partial" ]; }
# wait (up to 10 s) until a file matching dir/pattern has at least min bytes; prints its name
wait_for_bytes() {
	i=0
	while [ $i -lt 100 ]; do
		for f in "$1"/$2; do
			[ -f "$f" ] && [ "$(fsize "$f")" -ge "$3" ] && { echo "$f"; return 0; }
		done
		sleep 0.1
		i=$((i + 1))
	done
	return 1
}

# resume_and_check WHAT DIR KEPT: pull big into DIR again, which held KEPT bytes of weights.bin;
# rsync must receive about what was missing: all of it, and not much more
resume_and_check() {
	t pull "$URL/big" "$2"
	expect_ok "$1: resumed pull"
	missing=$((SHARD - $3))
	got=$(received)
	check "$1: received $got bytes for $missing missing" \
		test "$got" -ge "$missing" -a "$got" -le $((missing + missing / 20 + 16384))
	check "$1: files differ" same_tree "$SRC/big" "$2"
	check "$1: not complete" complete "$2"
}

for f in config.json model.safetensors reference.json reference.safetensors; do
	[ -f "$FIXTURE/$f" ] || { echo "pull.sh: FAIL: fixture $FIXTURE/$f missing (make testdata)" >&2; exit 1; }
done
[ -x "$BIN" ] || { echo "pull.sh: FAIL: $BIN not built" >&2; exit 1; }
command -v rsync >/dev/null || { echo "pull.sh: FAIL: rsync is not installed" >&2; exit 1; }

# --- the source tree -------------------------------------------------------------------------
SRC=$T/src
mkdir -p "$SRC/tiny/sub" "$SRC/tiny/.git" "$SRC/big" "$SRC/nosums"
cp "$FIXTURE"/config.json "$FIXTURE"/model.safetensors "$FIXTURE"/reference.json \
	"$FIXTURE"/reference.safetensors "$SRC/tiny/"
head -c 4194304 /dev/urandom >"$SRC/tiny/shard.bin"
for n in 0 1 55 56 63 64 65 1000001; do head -c $n /dev/urandom >"$SRC/tiny/sub/len$n"; done
echo '{}' >"$SRC/tiny/sub/with space.json"
echo hidden >"$SRC/tiny/.git/objects"
echo hidden >"$SRC/tiny/.hidden"
head -c 4194304 /dev/urandom >"$SRC/big/weights.bin"
echo '{}' >"$SRC/big/a.json"
echo x >"$SRC/nosums/a.json"
SHARD=4194304

# --- publish: the manifest is what coreutils would write --------------------------------------
t publish "$SRC/tiny"
expect_ok "publish"
(cd "$SRC/tiny" && find . -type f ! -path '*/.*' ! -name SHA256SUMS | sed 's|^\./||' | LC_ALL=C sort |
	while IFS= read -r f; do sha256sum "$f"; done) >"$T/expected.sums"
check "publish: SHA256SUMS differs from sha256sum's" cmp -s "$T/expected.sums" "$SRC/tiny/SHA256SUMS"
check "publish: sha256sum -c rejects it" sh -c "cd '$SRC/tiny' && sha256sum -c --quiet SHA256SUMS"
check "publish: hidden files listed" sh -c "! grep -q hidden '$SRC/tiny/SHA256SUMS'"
t publish "$SRC/big"
expect_ok "publish big"
t publish "$T/none"
expect_err "publish of a missing directory" "No such file or directory"

# --- the daemon: a free port, found by trying --------------------------------------------------
{
	echo "pid file = $T/rsyncd.pid"
	echo "use chroot = false"
	if [ "$(id -u)" = 0 ]; then
		echo "uid = 0"
		echo "gid = 0"
	fi
	echo "[models]"
	echo "path = $SRC"
	echo "read only = true"
} >"$T/rsyncd.conf"
PORT=
i=0
while [ $i -lt 20 ] && [ -z "$PORT" ]; do
	p=$((20000 + ($$ * 7 + i * 977) % 40000))
	rm -f "$T/rsyncd.pid"
	rsync --daemon --no-detach --config="$T/rsyncd.conf" --address=127.0.0.1 --port=$p \
		--log-file="$T/rsyncd.log" &
	DPID=$!
	j=0
	while [ $j -lt 30 ]; do
		if ! kill -0 "$DPID" 2>/dev/null; then
			break # the port was taken: the daemon gave up
		fi
		if rsync --contimeout=2 "rsync://127.0.0.1:$p/" 2>/dev/null | grep -q models; then
			PORT=$p
			break
		fi
		sleep 0.1
		j=$((j + 1))
	done
	if [ -z "$PORT" ]; then
		kill "$DPID" 2>/dev/null
		wait "$DPID" 2>/dev/null
		DPID=
	fi
	i=$((i + 1))
done
[ -n "$PORT" ] || { echo "pull.sh: FAIL: could not start an rsync daemon on loopback" >&2; exit 1; }
URL=rsync://127.0.0.1:$PORT/models

# --- a fresh pull --------------------------------------------------------------------------------
D=$T/dst/tiny
t pull "$URL/tiny" "$D"
expect_ok "fresh pull"
check "fresh pull: files differ from the source" same_tree "$SRC/tiny" "$D"
check "fresh pull: not marked complete" complete "$D"
check "fresh pull: hidden files pulled" test ! -e "$D/.git" -a ! -e "$D/.hidden"
check "fresh pull: output on stderr without a terminal" test ! -s "$T/err"
t check "$D"
expect_ok "toasted check of the pulled model"

# --- on a terminal (script(1) gives it one): a progress line with bytes, rate and file ---------
script -qec "'$BIN' pull --bwlimit 4000 '$URL/big' '$T/dst/tty'" /dev/null >"$T/tty" 2>&1
rc=$?
expect_ok "pull on a terminal"
check "no progress line on a terminal: $(tr '\r' '\n' <"$T/tty" | tail -3)" \
	grep -q "pulling   \[#*\.*\] *[0-9]*%  [0-9.]* [kM]*B / ~[0-9.]* [kM]*B  [0-9.]* [kM]*B/s.*weights.bin" "$T/tty"
check "no verification progress on a terminal" grep -q "verifying \[####################\] 100%" "$T/tty"

# --- by NAME from TOASTED_PULL_SOURCE into the default DEST; then a pull with nothing to do ------
mkdir -p "$T/home"
te HOME="$T/home" TOASTED_PULL_SOURCE="$URL" "$BIN" pull big
expect_ok "pull NAME"
check "pull NAME: not in ~/models/NAME" same_tree "$SRC/big" "$T/home/models/big"
check "pull NAME: not complete" complete "$T/home/models/big"
te HOME="$T/home" TOASTED_PULL_SOURCE="$URL/" "$BIN" pull big
expect_ok "pull NAME again"
check "pull with nothing to do moved files: $(cat "$T/out")" test "$(transferred)" = 0
check "pull with nothing to do received $(received) bytes" test "$(received)" -lt 16384

# --- interrupted by SIGTERM, resumed from rsync's partial file -----------------------------------
R=$T/dst/r1
"$BIN" pull --bwlimit 1000 "$URL/big" "$R" >"$T/out" 2>"$T/err" &
P=$!
if wait_for_bytes "$R" '.weights.bin.*' 1000000 >/dev/null; then
	"$BIN" pull "$URL/big" "$R" >"$T/out2" 2>"$T/err2"
	check "a second pull into a busy DEST: $(cat "$T/err2")" grep -q "another toasted pull" "$T/err2"
	kill -TERM $P
	wait $P
	rc=$?
	expect_err "pull interrupted by SIGTERM" "interrupted; resume with: toasted pull $URL/big $R"
	check "interrupted pull: marker missing" test -f "$R/.toasted-pull-incomplete"
	part=$R/.toasted-partial/weights.bin
	check "interrupted pull: no partial file" test -f "$part"
	P_BYTES=$(fsize "$part" 2>/dev/null || echo 0)
	t check "$R" --reference "$FIXTURE/reference.safetensors"
	expect_err "toasted check of an interrupted pull" "$R is an incomplete pull; resume with: toasted pull $URL/big $R"
	resume_and_check "after SIGTERM" "$R" "$P_BYTES"
else
	fail "the throttled pull never wrote 1 MB"
	kill $P 2>/dev/null
	wait $P
fi

# --- everything killed with SIGKILL: rsync's temporary file is kept aside and reused -------------
R=$T/dst/r2
setsid sh -c 'echo $$ >"$1"; shift; exec "$@"' sh "$T/pgid" "$BIN" pull --bwlimit 1000 "$URL/big" "$R" \
	>"$T/out" 2>"$T/err" &
P=$!
if wait_for_bytes "$R" '.weights.bin.*' 1000000 >/dev/null; then
	perl -e 'kill "KILL", -$ARGV[0]' "$(cat "$T/pgid")" # the group: toasted and rsync, no cleanup
	wait $P 2>/dev/null
	sleep 0.2
	tmpf=$(wait_for_bytes "$R" '.weights.bin.*' 1)
	K_BYTES=$(fsize "$tmpf")
	resume_and_check "after SIGKILL" "$R" "$K_BYTES"
	check "after SIGKILL: temporary file left" sh -c "! ls -a '$R' | grep -q '^\.weights'"
else
	fail "the throttled pull never wrote 1 MB"
	perl -e 'kill "KILL", -$ARGV[0]' "$(cat "$T/pgid")"
	wait $P
fi

# --- an update of one file: only its changed blocks move -----------------------------------------
printf 'toasted update test: one hundred bytes change in the middle of the shard, nothing else....!\n' |
	dd of="$SRC/tiny/shard.bin" bs=1 seek=2000000 conv=notrunc 2>/dev/null
touch -d @1600000000 "$SRC/tiny/shard.bin" # rsync compares whole seconds: make the change visible
t publish "$SRC/tiny"
t pull "$URL/tiny" "$D"
expect_ok "update pull"
check "update: $(transferred) files transferred, expected 1" test "$(transferred)" = 1
check "update: received $(received) bytes for a 100-byte change" test "$(received)" -lt 65536
check "update: files differ" same_tree "$SRC/tiny" "$D"

# --- a source whose file does not match its manifest ----------------------------------------------
cp "$SRC/tiny/shard.bin" "$T/shard.good"
printf 'corrupt' | dd of="$SRC/tiny/shard.bin" bs=1 seek=1000 conv=notrunc 2>/dev/null
touch -d @1700000000 "$SRC/tiny/shard.bin"
t pull "$URL/tiny" "$D"
expect_err "corrupted source" "files do not match SHA256SUMS: shard.bin (wrong SHA-256)"
expect_err "corrupted source: count" "1 of 14 files"
expect_err "corrupted source: resume hint" "resume with: toasted pull $URL/tiny $D"
check "corrupted source: marker missing" test -f "$D/.toasted-pull-incomplete"
t check "$D"
expect_err "toasted check after a failed verification" "is an incomplete pull; resume with: toasted pull $URL/tiny $D"
cp "$T/shard.good" "$SRC/tiny/shard.bin"
touch -d @1600000000 "$SRC/tiny/shard.bin"
t pull "$URL/tiny" "$D"
expect_ok "pull after the source was repaired"
check "repaired: not complete" complete "$D"
t check "$D"
expect_ok "toasted check after the repair"

# --- a local file corrupted behind rsync's back (same size and time) ------------------------------
printf 'rot' | dd of="$D/shard.bin" bs=1 seek=3000000 conv=notrunc 2>/dev/null
touch -r "$SRC/tiny/shard.bin" "$D/shard.bin"
t pull "$URL/tiny" "$D"
expect_err "local corruption" "shard.bin (wrong SHA-256)"
t pull "$URL/tiny" "$D"
expect_ok "pull repairing a local corruption"
check "local repair: $(transferred) files transferred, expected 1" test "$(transferred)" = 1
check "local repair: received $(received) bytes" test "$(received)" -lt 65536
check "local repair: files differ" same_tree "$SRC/tiny" "$D"

# --- bad sources: clear errors, and DEST not created ----------------------------------------------
E=$T/dst/never
t pull "rsync://127.0.0.1:1/models/tiny" "$E"
expect_err "connection refused" "cannot reach rsync://127.0.0.1:1/models/tiny: failed to connect"
t pull "rsync://127.0.0.1:$PORT/nomodule/tiny" "$E"
expect_err "unknown module" "Unknown module 'nomodule'"
t pull "$URL/absent" "$E"
expect_err "missing model" "$URL/absent does not exist or has no SHA256SUMS"
t pull "$URL/nosums" "$E"
expect_err "no manifest on the daemon" "$URL/nosums does not exist or has no SHA256SUMS"
t pull "$SRC/nosums" "$E"
expect_err "no manifest in a local source" "has no SHA256SUMS; write it with: toasted publish $SRC/nosums"
t pull "$T/absent" "$E"
expect_err "missing local source" "$T/absent: No such file or directory"
t pull -- "$E"
expect_err "an option as SOURCE" "unexpected argument"
t pull "u@-oProxyCommand=false:x" "$E"
expect_err "a host that ssh would take for an option" "a host may not begin with '-'"
te PATH=/nonexistent "$BIN" pull "$URL/tiny" "$E"
expect_err "missing rsync" "rsync is not installed"
mkdir -p "$SRC/evil"
echo x >"$SRC/evil/a.json"
echo "0000000000000000000000000000000000000000000000000000000000000000  ../tiny/shard.bin" >"$SRC/evil/SHA256SUMS"
t pull "$URL/evil" "$E"
expect_err "a manifest naming ../" "../tiny/shard.bin: \".\", \"..\" or hidden path component"
check "DEST created by failing pulls" test ! -e "$E"

# --- bad destinations ----------------------------------------------------------------------------
echo x >"$T/afile"
t pull "$URL/big" "$T/afile"
expect_err "DEST a file" "$T/afile exists and is not a directory"
t pull "$URL/big" "$T/afile/sub"
expect_err "DEST under a file" "cannot create $T/afile/sub: Not a directory"
mkdir -p "$T/foreign"
echo mine >"$T/foreign/notes.txt"
t pull "$URL/big" "$T/foreign"
expect_err "DEST a foreign directory" "$T/foreign is not empty and holds no model pulled by toasted"
check "foreign DEST touched" test "$(ls -A "$T/foreign")" = notes.txt
t pull "$SRC/big" "$SRC/big"
expect_err "DEST the SOURCE" "is the same directory as"
t pull "$SRC/big" "$SRC/big/copy"
expect_err "DEST inside SOURCE" "is inside"
check "DEST inside SOURCE left behind" test ! -e "$SRC/big/copy"

# --- a local directory SOURCE --------------------------------------------------------------------
L=$T/dst/local
t pull "$SRC/tiny" "$L"
expect_ok "local pull"
check "local pull: files differ" same_tree "$SRC/tiny" "$L"
check "local pull: not complete" complete "$L"

# --- a full disk (a 3 MB tmpfs in a private mount namespace) -------------------------------------
mkdir -p "$T/small"
if unshare -rm sh -c "mount -t tmpfs -o size=3m tmpfs '$T/small'" 2>/dev/null; then
	unshare -rm sh -c "mount -t tmpfs -o size=3m tmpfs '$T/small' &&
		'$BIN' pull '$SRC/tiny' '$T/small/m' >'$T/out' 2>'$T/err'; echo \$? >'$T/rc'"
	rc=$(cat "$T/rc")
	expect_err "full disk" "$T/small/m: disk full"
	expect_err "full disk: resume hint" "resume with: toasted pull $SRC/tiny $T/small/m"
else
	echo "pull.sh: SKIP full-disk case: cannot mount a tmpfs in a user namespace here" >&2
fi

if [ $fails -ne 0 ]; then
	echo "pull.sh: $fails of $checks checks FAILED (rsync daemon log: $(tail -3 "$T/rsyncd.log" 2>/dev/null))" >&2
	exit 1
fi
echo "pull.sh: $checks checks OK"
