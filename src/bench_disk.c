/* bench_disk.c — `cairn bench -m DIR --expert-cache-mb N`: decode of a checkpoint read from disk,
 * through the mapping and through the expert cache, in one run.
 *
 * Meant to run inside a memory cgroup smaller than the checkpoint (scripts/bench.sh makes one of
 * half its size; the page cache counts against it), so neither pass can keep the weights in
 * memory. Before each pass every shard's cached pages are dropped (POSIX_FADV_DONTNEED). Per pass:
 * decode tok/s, bytes the process read from storage per decoded token (/proc/self/io read_bytes,
 * which counts page faults on the mapping and preads alike), and the same bytes/s as a fraction
 * of the disk's sequential read bandwidth measured at the start of this run; for the cache also
 * its hit rate over the decode. The greedy ids of both passes must be identical. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "cli.h"
#include "core/experts.h"
#include "core/util.h"

enum { READ_BLOCK = 8 << 20, MAX_IDS = 4096 };
static const size_t BANDWIDTH_BYTES = (size_t)1 << 30;   /* read for the disk bandwidth figure */

typedef struct {
    double decode_tok_s, bytes_per_token, disk_fraction, hit_rate, expert_bytes_per_token;
    size_t rss, mlocked;
    int ids[MAX_IDS];
} pass_result;

/* Bytes this process has caused to be read from storage (0 if the kernel does not account it). */
static uint64_t storage_read_bytes(void) {
    FILE *f = fopen("/proc/self/io", "r");
    char line[128];
    unsigned long long v = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "read_bytes: %llu", &v) == 1) break;
    if (f) fclose(f);
    return v;
}

/* Calls fn on an open descriptor of every *.safetensors of dir. */
static void each_shard(const char *dir, void (*fn)(int fd, void *ctx), void *ctx) {
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 12 || strcmp(e->d_name + n - 12, ".safetensors")) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) fn(fd, ctx), close(fd);
    }
    if (d) closedir(d);
}

static void drop_cached(int fd, void *ctx) { posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); }

typedef struct {
    unsigned char *buf;
    size_t done;
} seq_read;

static void read_some(int fd, void *ctx) {
    seq_read *r = ctx;
    off_t off = 0;
    ssize_t got;
    while (r->done < BANDWIDTH_BYTES && (got = pread(fd, r->buf, READ_BLOCK, off)) > 0) {
        r->done += (size_t)got;
        off += got;
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
}

/* Sequential read bandwidth of the checkpoint's own files from disk, bytes/s. */
static double disk_bandwidth(const char *dir) {
    each_shard(dir, drop_cached, NULL);
    seq_read r = {xmalloc(READ_BLOCK), 0};
    uint64_t before = storage_read_bytes();
    double t0 = now_seconds();
    each_shard(dir, read_some, &r);
    double t = now_seconds() - t0;
    uint64_t from_disk = storage_read_bytes() - before;
    free(r.buf);
    return t > 0 ? (double)(from_disk ? from_disk : r.done) / t : 0;
}

/* One pass: open (cached when mb > 0), prefill, then timed greedy decode. */
static int run_pass(const bench_opts *o, double mb, double disk_bw, pass_result *p, char *err, size_t errlen) {
    each_shard(o->model_dir, drop_cached, NULL);
    model *m = model_open(o->model_dir, o->num, 0, err, errlen);
    if (!m) return -1;
    p->mlocked = o->mlock ? cli_mlock("bench", m) : 0;
    int rc = mb > 0 ? model_expert_cache(m, mb, NULL, err, errlen) : 0;
    seq *s = rc ? NULL : seq_new(m, (int)(o->prompt + o->decode + 1), err, errlen);
    if (!s) rc = -1;
    float *logits = xmalloc(sizeof(float) * m->vocab_size);
    int *prompt = bench_prompt((int)o->prompt, m->vocab_size, 0);
    if (!rc) rc = seq_feed(s, prompt, (int)o->prompt, logits, err, errlen);
    experts_stats before = {0}, after = {0};
    if (mb > 0) experts_get_stats(m->experts, &before);
    uint64_t read0 = storage_read_bytes();
    double t0 = now_seconds();
    for (long i = 0; !rc && i < o->decode; i++) {
        int id = p->ids[i] = bench_argmax(logits, m->vocab_size);
        rc = seq_feed(s, &id, 1, logits, err, errlen);
    }
    double t = now_seconds() - t0;
    uint64_t read = storage_read_bytes() - read0;
    if (mb > 0) experts_get_stats(m->experts, &after);
    p->decode_tok_s = t > 0 ? o->decode / t : 0;
    p->bytes_per_token = (double)read / o->decode;
    p->disk_fraction = disk_bw > 0 && t > 0 ? read / t / disk_bw : 0;
    uint64_t uses = after.uses - before.uses;
    p->hit_rate = uses ? (double)(after.hits - before.hits) / uses : 0;
    p->expert_bytes_per_token = (double)(after.bytes_read - before.bytes_read) / o->decode;
    p->rss = rss_bytes();
    free(prompt);
    free(logits);
    seq_free(s);
    model_close(m);
    return rc;
}

static void print_pass(const char *name, const pass_result *p, int json) {
    if (json) {
        printf("\"%s\":{\"decode_tok_s\":%.4f,\"bytes_read_per_token\":%.0f,\"disk_read_fraction\":%.4f,"
               "\"hit_rate\":%.4f,\"expert_bytes_read_per_token\":%.0f,\"rss_mb\":%.1f,\"mlocked_bytes\":%zu}", name,
               p->decode_tok_s, p->bytes_per_token, p->disk_fraction, p->hit_rate, p->expert_bytes_per_token,
               p->rss / 1048576.0, p->mlocked);
        return;
    }
    printf("%-13s decode %8.3f tok/s  %9.1f MB read/token  %.3f of the disk bandwidth  hit rate %.3f  rss %.0f MB\n",
           name, p->decode_tok_s, p->bytes_per_token / 1e6, p->disk_fraction, p->hit_rate, p->rss / 1048576.0);
}

int bench_disk(const bench_opts *o) {
    if (o->decode > MAX_IDS) { fprintf(stderr, "cairn bench: --decode at most %d with --expert-cache-mb\n", MAX_IDS); return 2; }
    char err[512] = "";
    double bw = disk_bandwidth(o->model_dir);
    pass_result *mapped = xcalloc(1, sizeof *mapped), *cached = xcalloc(1, sizeof *cached);
    int rc = run_pass(o, 0, bw, mapped, err, sizeof err);
    if (!rc) rc = run_pass(o, o->expert_cache_mb, bw, cached, err, sizeof err);
    if (rc) {
        fprintf(stderr, "cairn bench: %s\n", err);
    } else {
        int same = !memcmp(mapped->ids, cached->ids, sizeof(int) * (size_t)o->decode);
        double speedup = mapped->decode_tok_s > 0 ? cached->decode_tok_s / mapped->decode_tok_s : 0;
        if (o->json) {
            printf("{\"disk_read_gbs\":%.4f,\"prompt\":%ld,\"decode\":%ld,\"expert_cache_mb\":%.1f,", bw / 1e9, o->prompt,
                   o->decode, o->expert_cache_mb);
            print_pass("mmap", mapped, 1);
            printf(",");
            print_pass("expert_cache", cached, 1);
            printf(",\"cache_over_mmap_decode\":%.4f,\"identical\":%s}\n", speedup, same ? "true" : "false");
        } else {
            printf("disk read bandwidth %.3f GB/s (this checkpoint's files, page cache dropped)\n", bw / 1e9);
            print_pass("mmap", mapped, 0);
            print_pass("expert cache", cached, 0);
            printf("expert cache / mmap decode %.3f, greedy ids %s\n", speedup, same ? "identical" : "DIFFER");
        }
        if (!same) rc = -1;
    }
    free(mapped);
    free(cached);
    return rc ? 1 : 0;
}
