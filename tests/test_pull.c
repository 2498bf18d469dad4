/*
 * test_pull.c - the parts of `toasted pull` that need no rsync: SHA-256 against the FIPS 180-2
 * and NIST example vectors, the SHA256SUMS parser (good and hostile manifests) and writer,
 * directory scans and parallel hashing, SOURCE classification, and the incomplete-pull marker,
 * including toast_engine_open() refusing a marked directory. tests/pull.sh covers rsync itself.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <nettle/sha2.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/modeldir.h"
#include "pull/manifest.h"
#include "pull/pull.h"
#include "test.h"
#include "toasted.h"

static char tmpdir[256];

static void write_file(const char *dir, const char *name, const void *data, size_t n)
{
	char path[1024];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	if (!f) {
		CHECK(0, "cannot write %s", path);
		return;
	}
	fwrite(data, 1, n, f);
	fclose(f);
}

static void test_sha256_vectors(void)
{
	/* FIPS 180-2 appendix B and the NIST "SHA256ShortMsg"/long-message examples */
	static const struct {
		const char *msg;
		const char *hex;
	} v[] = {
		{"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
		{"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
		 "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
		{"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrst"
		 "nopqrstu",
		 "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
	};
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		write_file(tmpdir, "vec", v[i].msg, strlen(v[i].msg));
		char path[512], hex[65];
		unsigned char d[32];
		snprintf(path, sizeof(path), "%s/vec", tmpdir);
		CHECK(toast_sha256_file(path, d, NULL) == TOAST_OK, "hashing vector %zu", i);
		toast_sha256_hex(d, hex);
		CHECK(strcmp(hex, v[i].hex) == 0, "vector %zu: got %s want %s", i, hex, v[i].hex);
	}
	/* one million 'a': many read blocks */
	size_t n = 1000000;
	char *a = malloc(n);
	memset(a, 'a', n);
	write_file(tmpdir, "million", a, n);
	free(a);
	char path[512], hex[65];
	unsigned char d[32];
	snprintf(path, sizeof(path), "%s/million", tmpdir);
	CHECK(toast_sha256_file(path, d, NULL) == TOAST_OK, "hashing a million a");
	toast_sha256_hex(d, hex);
	CHECK(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0, "million a: %s", hex);

	/* sizes around the 1 MiB read block: the file hash equals the hash of the bytes in memory */
	size_t sizes[] = {(1u << 20) - 1, 1u << 20, (1u << 20) + 1, (2u << 20) + 63};
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		unsigned char *b = malloc(sizes[k]), want[32];
		for (size_t i = 0; i < sizes[k]; i++)
			b[i] = (unsigned char)(i * 2654435761u >> 13);
		struct sha256_ctx c;
		sha256_init(&c);
		sha256_update(&c, sizes[k], b);
		sha256_digest(&c, 32, want);
		write_file(tmpdir, "blocks", b, sizes[k]);
		free(b);
		snprintf(path, sizeof(path), "%s/blocks", tmpdir);
		CHECK(toast_sha256_file(path, d, NULL) == TOAST_OK && memcmp(d, want, 32) == 0, "file of %zu bytes",
		      sizes[k]);
	}
	struct toast_error err = {0};
	CHECK(toast_sha256_file(tmpdir, d, &err) == TOAST_ERR_IO && strstr(err.msg, "directory"),
	      "hashing a directory: %s", err.msg);
	snprintf(path, sizeof(path), "%s/fifo", tmpdir);
	mkfifo(path, 0600);
	CHECK(toast_sha256_file(path, d, &err) == TOAST_ERR_IO, "a FIFO is not hashed (and does not hang)");
	unlink(path);
}

#define H64 "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"

static enum toast_status parse(const char *text, struct toast_manifest *m, struct toast_error *err)
{
	return toast_manifest_parse(m, text, strlen(text), "SUMS", err);
}

static void test_manifest_parse(void)
{
	struct toast_manifest m;
	struct toast_error err = {0};
	const char *good = H64 "  b.safetensors\r\n"
			       "\n" H64 " *./a dir/config.json\n"
			       "\\" H64 "  we\\\\ird\\nname\n" H64 "  SHA256SUMS\n"
			       "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD  c";
	CHECK(parse(good, &m, &err) == TOAST_OK, "good manifest: %s", err.msg);
	CHECK(m.n_files == 4, "4 files (SHA256SUMS itself skipped), got %d", m.n_files);
	if (m.n_files == 4) {
		CHECK(strcmp(m.files[0].name, "a dir/config.json") == 0, "./ dropped, binary mode: %s", m.files[0].name);
		CHECK(strcmp(m.files[1].name, "b.safetensors") == 0, "CRLF: [%s]", m.files[1].name);
		CHECK(strcmp(m.files[2].name, "c") == 0, "upper-case hex, no newline at the end");
		CHECK(strcmp(m.files[3].name, "we\\ird\nname") == 0, "escaped name: [%s]", m.files[3].name);
		CHECK(m.files[0].sha256[0] == 0xba && m.files[2].sha256[31] == 0xad, "digest bytes");
		CHECK(toast_manifest_find(&m, "c") == 2 && toast_manifest_find(&m, "d") == -1, "find");
	}
	toast_manifest_free(&m);

	static const struct {
		const char *text, *want;
	} bad[] = {
		{"", "lists no files"},
		{H64 "  SHA256SUMS\n", "lists no files"},
		{"abc  x\n", "line 1: expected 64 hex digits"},
		{H64 " x\n", "line 1: expected 64 hex digits"},
		{H64 "\tx\n", "line 1: expected 64 hex digits"},
		{H64 "  ok\n" H64 "\n", "line 2: expected 64 hex digits"},
		{H64 "  ok\nzz7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad  x\n",
		 "line 2: the digest is not 64 hex digits"},
		{H64 "  /etc/passwd\n", "/etc/passwd: absolute path"},
		{H64 "  ../x\n", "../x: \".\", \"..\" or hidden path component"},
		{H64 "  a/../../x\n", "hidden path component"},
		{H64 "  .git/config\n", "hidden path component"},
		{H64 "  a/.cache/x\n", "hidden path component"},
		{H64 "  a//b\n", "empty path component"},
		{H64 "  a/\n", "trailing '/'"},
		{H64 "  ./\n", "empty name"},
		{"\\" H64 "  a\\x\n", "bad escape"},
		{H64 "  x\n" H64 "  y\n" H64 "  x\n", "x is listed twice"},
		{H64 "  x\n" H64 "  ./x\n", "x is listed twice"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err.msg[0] = 0;
		enum toast_status st = parse(bad[i].text, &m, &err);
		CHECK(st == TOAST_ERR_FORMAT && strstr(err.msg, bad[i].want) && strstr(err.msg, "SUMS"),
		      "bad manifest %zu: want \"%s\", got %d \"%s\"", i, bad[i].want, st, err.msg);
		CHECK(m.files == NULL && m.n_files == 0, "bad manifest %zu left files", i);
	}
	/* a name of TOAST_MANIFEST_MAX_NAME bytes passes, one more does not */
	size_t n = TOAST_MANIFEST_MAX_NAME + 1;
	char *text = malloc(66 + n + 2);
	memcpy(text, H64 "  ", 66);
	memset(text + 66, 'n', n);
	text[66 + n] = 0;
	CHECK(parse(text, &m, &err) == TOAST_ERR_FORMAT && strstr(err.msg, "longer than"), "long name: %s", err.msg);
	text[66 + n - 1] = 0;
	CHECK(parse(text, &m, &err) == TOAST_OK, "longest name: %s", err.msg);
	toast_manifest_free(&m);
	free(text);
	CHECK(toast_manifest_parse(&m, "x", (size_t)TOAST_MANIFEST_MAX_BYTES + 1, "SUMS", &err) == TOAST_ERR_FORMAT,
	      "oversized manifest");
}

static volatile sig_atomic_t cancel_now = 1;

static void test_scan_hash_write(void)
{
	char dir[512], path[600];
	snprintf(dir, sizeof(dir), "%s/model", tmpdir);
	mkdir(dir, 0755);
	snprintf(path, sizeof(path), "%s/sub", dir);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/.git", dir);
	mkdir(path, 0755);
	write_file(dir, "abc", "abc", 3);
	write_file(dir, "empty", "", 0);
	write_file(dir, "sub/x y", "abc", 3);
	write_file(dir, "sub/back\\slash\nline", "abc", 3);
	write_file(dir, ".hidden", "h", 1);
	write_file(dir, ".git/config", "h", 1);
	write_file(dir, "SHA256SUMS", "old", 3);
	struct toast_manifest m;
	struct toast_error err = {0};
	CHECK(toast_manifest_scan(&m, dir, &err) == TOAST_OK, "scan: %s", err.msg);
	CHECK(m.n_files == 4, "scan finds 4 model files, got %d", m.n_files);
	CHECK(toast_manifest_hash(&m, dir, 3, NULL, NULL, NULL, &err) == TOAST_OK, "hash: %s", err.msg);
	char hex[65];
	for (int i = 0; i < m.n_files; i++) {
		toast_sha256_hex(m.files[i].got, hex);
		bool is_empty = strcmp(m.files[i].name, "empty") == 0;
		CHECK(m.files[i].hash_errno == 0 &&
			      strcmp(hex, is_empty ? "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" : H64) == 0,
		      "%s: %s", m.files[i].name, hex);
		memcpy(m.files[i].sha256, m.files[i].got, 32);
	}
	CHECK(toast_manifest_write(&m, dir, &err) == TOAST_OK, "write: %s", err.msg);
	struct toast_manifest back;
	snprintf(path, sizeof(path), "%s/SHA256SUMS", dir);
	CHECK(toast_manifest_load(&back, path, &err) == TOAST_OK, "reload: %s", err.msg);
	CHECK(back.n_files == m.n_files, "round trip keeps %d files, got %d", m.n_files, back.n_files);
	for (int i = 0; i < back.n_files && i < m.n_files; i++)
		CHECK(strcmp(back.files[i].name, m.files[i].name) == 0 && memcmp(back.files[i].sha256, m.files[i].sha256, 32) == 0,
		      "round trip of %s", m.files[i].name);
	toast_manifest_free(&back);

	/* a missing file does not stop the others; cancelling stops everything */
	snprintf(path, sizeof(path), "%s/abc", dir);
	unlink(path);
	CHECK(toast_manifest_hash(&m, dir, 0, NULL, NULL, NULL, &err) == TOAST_OK, "hash with a file missing");
	int i_abc = toast_manifest_find(&m, "abc"), i_sub = toast_manifest_find(&m, "sub/x y");
	CHECK(i_abc >= 0 && m.files[i_abc].hash_errno == ENOENT, "missing file reported ENOENT");
	CHECK(i_sub >= 0 && m.files[i_sub].hash_errno == 0, "other files still hashed");
	CHECK(toast_manifest_hash(&m, dir, 2, &cancel_now, NULL, NULL, &err) == TOAST_ERR_CANCELLED, "cancel");
	toast_manifest_free(&m);
}

static void test_source_parse(void)
{
	static const struct {
		const char *src;
		int kind; /* -1: refused */
		const char *name;
	} v[] = {
		{"rsync://host/models/Qwen3-Next", TOAST_PULL_DAEMON, "Qwen3-Next"},
		{"rsync://host:8873/models/a/b/", TOAST_PULL_DAEMON, "b"},
		{"rsync://host/models", TOAST_PULL_DAEMON, "models"},
		{"host::models/q3", TOAST_PULL_DAEMON, "q3"},
		{"user@host:models/q3", TOAST_PULL_SSH, "q3"},
		{"host:/srv/q3/", TOAST_PULL_SSH, "q3"},
		{"host:", TOAST_PULL_SSH, ""},
		{"host:~", TOAST_PULL_SSH, ""},
		{"/srv/models/q3", TOAST_PULL_LOCAL, "q3"},
		{"./a:b", TOAST_PULL_LOCAL, "a:b"},
		{"q3", TOAST_PULL_LOCAL, "q3"},
		{".", TOAST_PULL_LOCAL, ""},
		{"/srv/.hidden", TOAST_PULL_LOCAL, ""},
		{"", -1, ""},
		{"-e", -1, ""},
		{"--rsh=x", -1, ""},
		{"u@-oProxyCommand=x:y", -1, ""},
		{"-oProxyCommand=x:y", -1, ""},
		{"rsync://", -1, ""},
		{"rsync://host", -1, ""},
		{"rsync://host/", -1, ""},
		{"rsync:///m/x", -1, ""},
		{"host::", -1, ""},
		{":path", -1, ""},
		{"a\nb", -1, ""},
		{"host:-x", -1, ""},
		{"rsync://host/-m/x", -1, ""},
		{"host::-m", -1, ""},
	};
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		enum toast_pull_kind kind;
		char name[64];
		struct toast_error err = {0};
		enum toast_status st = toast_pull_source_parse(v[i].src, &kind, name, sizeof(name), &err);
		if (v[i].kind < 0)
			CHECK(st == TOAST_ERR_INVALID && err.msg[0], "source %zu refused (got %d)", i, st);
		else
			CHECK(st == TOAST_OK && (int)kind == v[i].kind && strcmp(name, v[i].name) == 0,
			      "source %s: status %d kind %d name [%s] (%s)", v[i].src, st, (int)kind, name, err.msg);
	}
}

static void test_modeldir(void)
{
	char dir[512];
	snprintf(dir, sizeof(dir), "%s/my model", tmpdir);
	mkdir(dir, 0755);
	struct toast_error err = {0};
	CHECK(toast_modeldir_check(dir, &err) == TOAST_OK, "no marker: %s", err.msg);
	CHECK(toast_modeldir_mark_incomplete(dir, "rsync://h/m/it's", &err) == TOAST_OK, "mark: %s", err.msg);
	char want[2048];
	snprintf(want, sizeof(want), "%s is an incomplete pull; resume with: toasted pull 'rsync://h/m/it'\\''s' '%s'",
		 dir, dir);
	CHECK(toast_modeldir_check(dir, &err) == TOAST_ERR_INVALID && strcmp(err.msg, want) == 0,
	      "message: %s", err.msg);
	/* every entry point that opens a model refuses it, before reading anything else */
	struct toast_engine *e = NULL;
	err.msg[0] = 0;
	CHECK(toast_engine_open(dir, NULL, &e, &err) == TOAST_ERR_INVALID && e == NULL &&
		      strstr(err.msg, "is an incomplete pull; resume with: toasted pull"),
	      "engine open: %s", err.msg);
	CHECK(toast_modeldir_mark_incomplete(dir, "bad\nsource", &err) == TOAST_ERR_INVALID, "control characters");
	/* a marker without a source line still refuses */
	char path[600];
	snprintf(path, sizeof(path), "%s/" TOAST_MODELDIR_MARKER, dir);
	FILE *f = fopen(path, "w");
	fputs("garbage\n", f);
	fclose(f);
	CHECK(toast_modeldir_check(dir, &err) == TOAST_ERR_INVALID && strstr(err.msg, "toasted pull SOURCE '"),
	      "sourceless marker: %s", err.msg);
	CHECK(toast_modeldir_mark_complete(dir, &err) == TOAST_OK, "complete: %s", err.msg);
	CHECK(toast_modeldir_check(dir, &err) == TOAST_OK, "marker removed");
	CHECK(toast_modeldir_mark_complete(dir, &err) == TOAST_OK, "completing twice");
	/* publishing an incomplete pull is refused too */
	toast_modeldir_mark_incomplete(dir, "/src", &err);
	struct toast_publish_result pr;
	CHECK(toast_publish(dir, 1, NULL, NULL, NULL, &pr, &err) == TOAST_ERR_INVALID, "publish of an incomplete pull");
	toast_modeldir_mark_complete(dir, &err);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(path);
}

int main(void)
{
	snprintf(tmpdir, sizeof(tmpdir), "%s/toasted-test-pull.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(tmpdir)) {
		fprintf(stderr, "test_pull: mkdtemp: %s\n", strerror(errno));
		return 1;
	}
	test_sha256_vectors();
	test_manifest_parse();
	test_scan_hash_write();
	test_source_parse();
	test_modeldir();
	nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	return test_done("test_pull");
}
