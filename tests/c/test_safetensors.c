/* test_safetensors.c — good checkpoints load and return their bytes; every kind of corrupt file
 * is rejected with a message naming the problem. Files are written byte by byte into a temp dir. */
#include "core/safetensors.h"
#include "core/util.h"
#include "test.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];
static int case_no;

/* A fresh directory for one checkpoint. */
static const char *new_dir(char *buf, size_t n) {
    snprintf(buf, n, "%s/c%d", root, case_no++);
    mkdir(buf, 0700);
    return buf;
}

static void write_bytes(const char *dir, const char *name, const void *p, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(2); }
    fwrite(p, 1, n, f);
    fclose(f);
}

/* A shard whose header is `json` (length taken from it) followed by `data_len` bytes 0,1,2,... */
static void write_shard_hlen(const char *dir, const char *name, uint64_t hlen, const char *json, size_t data_len) {
    size_t jl = strlen(json), n = 8 + jl + data_len;
    unsigned char *buf = malloc(n);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(buf + 8, json, jl);
    for (size_t i = 0; i < data_len; i++) buf[8 + jl + i] = (unsigned char)i;
    write_bytes(dir, name, buf, n);
    free(buf);
}

static void write_shard(const char *dir, const char *name, const char *json, size_t data_len) {
    write_shard_hlen(dir, name, strlen(json), json, data_len);
}

/* Opening must fail and the message must contain every given substring. */
static void expect_reject(const char *dir, const char *what, const char *sub1, const char *sub2) {
    char err[512] = "";
    st_file *f = st_open(dir, 0, err, sizeof err);
    CHECK(f == NULL, "%s: corrupt checkpoint was accepted", what);
    st_close(f);
    CHECK(strstr(err, sub1) != NULL, "%s: error '%s' lacks '%s'", what, err, sub1);
    if (sub2) CHECK(strstr(err, sub2) != NULL, "%s: error '%s' lacks '%s'", what, err, sub2);
}

static void reject_single(const char *what, const char *json, size_t data_len, const char *sub1, const char *sub2) {
    char dir[300];
    new_dir(dir, sizeof dir);
    write_shard(dir, "model.safetensors", json, data_len);
    expect_reject(dir, what, sub1, sub2);
}

static void test_file_level_corruption(void) {
    char dir[300];
    new_dir(dir, sizeof dir);
    write_bytes(dir, "model.safetensors", "\x10\0\0\0", 4);
    expect_reject(dir, "short file", "shorter than 8 bytes", "model.safetensors");

    new_dir(dir, sizeof dir);
    write_bytes(dir, "model.safetensors", "", 0);
    expect_reject(dir, "empty file", "shorter than 8 bytes", NULL);

    new_dir(dir, sizeof dir);
    write_shard_hlen(dir, "model.safetensors", 1ull << 40, "{}", 0);
    expect_reject(dir, "absurd header", "absurd", NULL);

    new_dir(dir, sizeof dir);
    write_shard_hlen(dir, "model.safetensors", 4096, "{}", 16);
    expect_reject(dir, "header past end", "exceeds file size", NULL);

    reject_single("not json", "{\"a\": {\"dtype\": ", 0, "not valid JSON", NULL);

    /* An unterminated string running to the last byte of a page-sized file: the parser must stop at
     * the header length, since the byte after it is outside the mapping. */
    char page[4096 - 8 + 1];
    memset(page, 'x', sizeof page - 1);
    memcpy(page, "{\"a\": \"", 7);
    page[sizeof page - 1] = 0;
    reject_single("string to end of mapping", page, 0, "not valid JSON", NULL);
    reject_single("not object", "[1, 2, 3]", 0, "not a JSON object", NULL);

    new_dir(dir, sizeof dir);
    expect_reject(dir, "empty dir", "no model.safetensors", NULL);
}

static void test_entry_corruption(void) {
    reject_single("entry not object", "{\"w\": 3}", 0, "entry is not an object", "tensor w");
    reject_single("missing dtype", "{\"w\": {\"shape\": [2], \"data_offsets\": [0, 8]}}", 8, "missing dtype",
                  "tensor w");
    reject_single("missing shape", "{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 8]}}", 8, "missing shape",
                  "tensor w");
    reject_single("missing offsets", "{\"w\": {\"dtype\": \"F32\", \"shape\": [2]}}", 8, "missing data_offsets",
                  "tensor w");
    reject_single("dtype type", "{\"w\": {\"dtype\": 7, \"shape\": [2], \"data_offsets\": [0, 8]}}", 8,
                  "dtype is not a string", NULL);
    reject_single("unknown dtype", "{\"w\": {\"dtype\": \"F128\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8,
                  "unknown dtype 'F128'", "tensor w");
    reject_single("shape type", "{\"w\": {\"dtype\": \"F32\", \"shape\": \"2\", \"data_offsets\": [0, 8]}}", 8,
                  "shape is not an array", NULL);
    reject_single("negative dim", "{\"w\": {\"dtype\": \"F32\", \"shape\": [2, -1], \"data_offsets\": [0, 8]}}", 8,
                  "dim 1 is not a non-negative integer", "tensor w");
    reject_single("fractional dim", "{\"w\": {\"dtype\": \"F32\", \"shape\": [2.5], \"data_offsets\": [0, 8]}}", 8,
                  "dim 0 is not a non-negative integer", NULL);
    reject_single("too many dims",
                  "{\"w\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1], \"data_offsets\": [0, 1]}}", 1,
                  "too many dims", "tensor w");
    reject_single("numel overflow",
                  "{\"w\": {\"dtype\": \"U8\", \"shape\": [4503599627370496, 4503599627370496], "
                  "\"data_offsets\": [0, 1]}}", 1, "numel overflows", NULL);
    reject_single("offsets arity", "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0]}}", 8,
                  "data_offsets must be 2", "tensor w");
    reject_single("offsets type", "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, \"8\"]}}", 8,
                  "data_offsets must be 2", NULL);
    reject_single("begin > end", "{\"w\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 4]}}", 8,
                  "begin 8 > end 4", "tensor w");
    reject_single("end beyond data", "{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 8,
                  "beyond data section", "tensor w");
    reject_single("size mismatch", "{\"w\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", 16,
                  "8 bytes stored but", "tensor w");
    reject_single("overlap",
                  "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                  " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", 16, "overlap", NULL);
    reject_single("duplicate in one header",
                  "{\"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]},"
                  " \"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [1, 2]}}", 2, "duplicate tensor a",
                  NULL);
}

static const char *shard_a = "{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}";
static const char *shard_b = "{\"y\": {\"dtype\": \"BF16\", \"shape\": [2, 2], \"data_offsets\": [0, 8]}}";

static void test_shard_corruption(void) {
    char dir[300];
    new_dir(dir, sizeof dir);
    write_shard(dir, "a.safetensors", shard_a, 8);
    write_shard(dir, "b.safetensors", shard_a, 8);
    expect_reject(dir, "duplicate across shards", "duplicate tensor x", "a.safetensors");

    const char *index = "{\"weight_map\": {\"x\": \"s1.safetensors\", \"y\": \"s2.safetensors\"}}";
    new_dir(dir, sizeof dir);
    write_shard(dir, "s1.safetensors", shard_a, 8);
    write_bytes(dir, "model.safetensors.index.json", index, strlen(index));
    expect_reject(dir, "missing shard", "s2.safetensors, which is missing", NULL);

    new_dir(dir, sizeof dir);
    write_shard(dir, "s1.safetensors", shard_b, 8);
    write_shard(dir, "s2.safetensors", shard_a, 8);
    write_bytes(dir, "model.safetensors.index.json", index, strlen(index));
    expect_reject(dir, "index points to wrong shard", "tensor x", "does not contain it");

    const char *bad_index = "{\"metadata\": {}}";
    new_dir(dir, sizeof dir);
    write_shard(dir, "s1.safetensors", shard_a, 8);
    write_bytes(dir, "model.safetensors.index.json", bad_index, strlen(bad_index));
    expect_reject(dir, "index without weight_map", "weight_map", NULL);

    const char *escape = "{\"weight_map\": {\"x\": \"../s1.safetensors\"}}";
    new_dir(dir, sizeof dir);
    write_bytes(dir, "model.safetensors.index.json", escape, strlen(escape));
    expect_reject(dir, "index path outside dir", "not a shard file name", NULL);
}

static void test_good_single(void) {
    char dir[300], err[512] = "";
    new_dir(dir, sizeof dir);
    const char *json = "{\"__metadata__\": {\"format\": \"pt\"},"
                       " \"w\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [8, 32]},"
                       " \"s\": {\"dtype\": \"F8_E8M0\", \"shape\": [], \"data_offsets\": [32, 33]},"
                       " \"e\": {\"dtype\": \"I64\", \"shape\": [0], \"data_offsets\": [33, 33]},"
                       " \"q\": {\"dtype\": \"F8_E4M3\", \"shape\": [8], \"data_offsets\": [0, 8]}}    ";
    write_shard(dir, "model.safetensors", json, 40);
    st_file *f = st_open(dir, 0, err, sizeof err);
    CHECK(f != NULL, "good file rejected: %s", err);
    if (!f) return;
    CHECK(st_count(f) == 4, "count %d", st_count(f));
    const st_tensor *w = st_find(f, "w");
    CHECK(w && w->type == DT_F32 && w->ndim == 2 && w->shape[0] == 2 && w->shape[1] == 3 && w->nbytes == 24, "w");
    CHECK(w && ((const unsigned char *)w->data)[0] == 8 && ((const unsigned char *)w->data)[23] == 31,
          "w bytes come from data offset 8");
    const st_tensor *s = st_find(f, "s");
    CHECK(s && s->ndim == 0 && s->nbytes == 1 && *(const unsigned char *)s->data == 32, "scalar");
    CHECK(st_find(f, "e") && st_find(f, "e")->nbytes == 0, "empty tensor");
    CHECK(st_find(f, "__metadata__") == NULL, "metadata is not a tensor");
    CHECK(st_find(f, "nope") == NULL, "absent name");
    CHECK(strstr(w->file, "model.safetensors") != NULL, "file %s", w->file);

    int64_t shape[2] = {2, 3}, wrong[2] = {3, 2};
    CHECK(st_expect(f, "w", DT_F32, 2, shape, err, sizeof err) == w, "expect ok: %s", err);
    CHECK(st_expect(f, "w", DT_BF16, 2, shape, err, sizeof err) == NULL, "wrong dtype accepted");
    CHECK(strstr(err, "tensor w in") && strstr(err, "expected BF16 [2,3], found F32 [2,3]"), "msg: %s", err);
    CHECK(st_expect(f, "w", DT_F32, 2, wrong, err, sizeof err) == NULL, "wrong shape accepted");
    CHECK(strstr(err, "expected F32 [3,2], found F32 [2,3]"), "msg: %s", err);
    CHECK(st_expect(f, "w", DT_F32, 1, shape, err, sizeof err) == NULL, "wrong ndim accepted");
    CHECK(st_expect(f, "missing.weight", DT_F32, 2, shape, err, sizeof err) == NULL, "missing accepted");
    CHECK(strstr(err, "missing tensor missing.weight"), "msg: %s", err);
    CHECK(strcmp(st_dir(f), dir) == 0, "dir %s", st_dir(f));
    CHECK(dtype_size(DT_BF16) == 2 && dtype_size(DT_I64) == 8 && strcmp(dtype_name(DT_F8_E4M3), "F8_E4M3") == 0,
          "dtype table");
    st_close(f);
}

/* Redirects stderr into a file around st_open so the progress bar can be inspected. */
static st_file *open_capturing_stderr(const char *dir, char *captured, size_t n, char *err, size_t errlen) {
    char path[300];
    snprintf(path, sizeof path, "%s/stderr.txt", root);
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    close(fd);
    st_file *f = st_open(dir, 1, err, errlen);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    size_t len = 0;
    char *text = read_file(path, &len, NULL, 0);
    snprintf(captured, n, "%s", text ? text : "");
    free(text);
    return f;
}

static void test_good_sharded(void) {
    char dir[300], err[512] = "", captured[512];
    new_dir(dir, sizeof dir);
    const char *index = "{\"metadata\": {\"total_size\": 16},"
                        " \"weight_map\": {\"x\": \"s1.safetensors\", \"y\": \"s2.safetensors\"}}";
    write_shard(dir, "s1.safetensors", shard_a, 8);
    write_shard(dir, "s2.safetensors", shard_b, 8);
    write_shard(dir, "stray.safetensors", shard_a, 8);   /* not in the index: must be ignored */
    write_bytes(dir, "model.safetensors.index.json", index, strlen(index));
    write_bytes(dir, "config.json", "{\"a\": 1}", 8);

    setenv("CAIRN_PROGRESS", "1", 1);
    st_file *f = open_capturing_stderr(dir, captured, sizeof captured, err, sizeof err);
    unsetenv("CAIRN_PROGRESS");
    CHECK(f != NULL, "sharded rejected: %s", err);
    if (!f) return;
    CHECK(strstr(captured, "loading 2/2 shards [") != NULL, "progress bar: '%s'", captured);
    CHECK(st_count(f) == 2, "count %d", st_count(f));
    const st_tensor *y = st_find(f, "y");
    CHECK(y && y->type == DT_BF16 && strstr(y->file, "s2.safetensors"), "y in s2");
    CHECK(y && ((const unsigned char *)y->data)[7] == 7, "y bytes");
    uint64_t fp = st_fingerprint(f);
    st_close(f);

    f = st_open(dir, 1, err, sizeof err);   /* a bar only if stderr is a tty; same result either way */
    CHECK(f && st_fingerprint(f) == fp, "fingerprint is stable");
    st_close(f);
    write_bytes(dir, "config.json", "{\"a\": 2}", 8);
    f = st_open(dir, 0, err, sizeof err);
    CHECK(f && st_fingerprint(f) != fp, "fingerprint covers config.json");
    uint64_t fp2 = f ? st_fingerprint(f) : 0;
    st_close(f);
    write_shard(dir, "s2.safetensors", "{\"y\": {\"dtype\": \"F16\", \"shape\": [2, 2], \"data_offsets\": [0, 8]}}", 8);
    f = st_open(dir, 0, err, sizeof err);
    CHECK(f && st_fingerprint(f) != fp2, "fingerprint covers shard headers");
    st_close(f);
}

/* Many tensors: every name must be found through the hash table. */
static void test_many_tensors(void) {
    enum { N = 5000 };
    char dir[300], err[512] = "";
    new_dir(dir, sizeof dir);
    size_t cap = (size_t)N * 96 + 16, off = 0;
    char *json = malloc(cap);
    off += (size_t)snprintf(json + off, cap - off, "{");
    for (int i = 0; i < N; i++)
        off += (size_t)snprintf(json + off, cap - off, "%s\"layers.%d.w\": {\"dtype\": \"I32\", \"shape\": [1],"
                                " \"data_offsets\": [%d, %d]}", i ? "," : "", i, 4 * i, 4 * i + 4);
    snprintf(json + off, cap - off, "}");
    write_shard(dir, "model.safetensors", json, 4 * N);
    free(json);
    st_file *f = st_open(dir, 0, err, sizeof err);
    CHECK(f != NULL, "many: %s", err);
    if (!f) return;
    int found = 0;
    for (int i = 0; i < N; i++) {
        char name[64];
        snprintf(name, sizeof name, "layers.%d.w", i);
        const st_tensor *t = st_find(f, name);
        found += t && t->data == st_find(f, name)->data && ((const unsigned char *)t->data)[0] == (unsigned char)(4 * i);
    }
    CHECK(found == N, "found %d of %d", found, N);
    st_close(f);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/cairn_st_XXXXXX");
    if (!mkdtemp(root)) { perror("mkdtemp"); return 2; }
    test_good_single();
    test_good_sharded();
    test_many_tensors();
    test_file_level_corruption();
    test_entry_corruption();
    test_shard_corruption();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    return TEST_END();
}
