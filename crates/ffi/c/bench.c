/*
 * The cost of the C boundary: one thread drives an index through the C
 * API with the runs of `pmhash bench --workload insert,get-pos,get-neg,delete`:
 *
 *   insert   N fresh keys into a table grown from empty (the engine's
 *            default size, a 64 MiB pool file that grows);
 *   get-pos  N gets of loaded keys drawn uniformly at random (drawn
 *            before timing, into a sequential stream);
 *   get-neg  N gets of absent keys, drawn the same way;
 *   delete   the N loaded keys, in insertion order.
 *
 * A last line times N calls of pmhash_index_engine(), which does nothing
 * inside the library but return a pointer the handle holds: what the
 * boundary itself (the call, the panic guard, the argument check) costs a
 * call.
 *
 * Each run has a new pool and table; the runs but insert first load the
 * N keys untimed, split over one thread per core (at most 8), as the
 * Rust benchmark does.
 *
 * Keys are distinct random 64-bit numbers: a bijective mix of a counter,
 * as the Rust benchmark makes them. Values are checked on every get.
 *
 *     bench --engine E --keys N [--pool DIR] [--durability strict|relaxed]
 */
#define _POSIX_C_SOURCE 200809L
#include <pmhash.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIB (1ull << 20)

/* A bijection on 64-bit numbers (the splitmix64 finalizer): distinct
 * inputs give distinct keys that look random. */
static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t key_of(uint64_t i) { return mix64(0x5EED0000ull + i * 0x9E3779B97F4A7C15ull); }
static uint64_t value_of(uint64_t key) { return (key << 29 | key >> 35) ^ 0xA5A55A5A0F0FF0F0ull; }

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, pmhash_status st) {
  fprintf(stderr, "%s: %s: %s\n", what, pmhash_status_name(st), pmhash_last_error());
  exit(1);
}

struct load_part {
  const pmhash_index *ix;
  const uint64_t *keys;
  uint64_t from, to;
  pmhash_status st;
};

static void *load_part(void *arg) {
  struct load_part *p = arg;
  p->st = PMHASH_STATUS_OK;
  for (uint64_t i = p->from; i < p->to && p->st == PMHASH_STATUS_OK; i++)
    p->st = pmhash_index_insert(p->ix, p->keys[i], value_of(p->keys[i]));
  return NULL;
}

/* A new pool at `path` with a new table; `keys` (if any) loaded untimed by
 * one thread per core, at most 8: the handle is shared between them. */
static pmhash_index *fresh(const char *path, const pmhash_index_options *o, const uint64_t *keys, uint64_t n) {
  unlink(path);
  pmhash_index *ix = NULL;
  pmhash_status st = pmhash_index_create(path, o, &ix);
  if (st != PMHASH_STATUS_OK) die("create", st);
  if (keys == NULL) return ix;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int parts = cores < 1 ? 1 : cores > 8 ? 8 : (int)cores;
  pthread_t threads[8];
  struct load_part part[8];
  for (int t = 0; t < parts; t++) {
    part[t] = (struct load_part){ix, keys, n * (uint64_t)t / (uint64_t)parts, n * (uint64_t)(t + 1) / (uint64_t)parts,
                                 PMHASH_STATUS_OK};
    if (pthread_create(&threads[t], NULL, load_part, &part[t]) != 0) die("load thread", PMHASH_STATUS_OK);
  }
  for (int t = 0; t < parts; t++) {
    pthread_join(threads[t], NULL);
    if (part[t].st != PMHASH_STATUS_OK) die("load", part[t].st);
  }
  return ix;
}

static void done(pmhash_index *ix, const char *path) {
  pmhash_status st = pmhash_index_close(ix);
  if (st != PMHASH_STATUS_OK) die("close", st);
  unlink(path);
}

static void report(const char *workload, const char *engine, uint64_t n, double seconds) {
  printf("%-8s %-12s %10llu ops %8.3f s %8.3f Mops/s\n", workload, engine, (unsigned long long)n, seconds,
         (double)n / seconds / 1e6);
}

int main(int argc, char **argv) {
  const char *engine = "pass", *pool_dir = "/dev/shm";
  uint32_t durability = PMHASH_DURABILITY_STRICT;
  uint64_t n = 1000000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--engine") == 0) engine = argv[i + 1];
    else if (strcmp(argv[i], "--keys") == 0) n = strtoull(argv[i + 1], NULL, 10);
    else if (strcmp(argv[i], "--pool") == 0) pool_dir = argv[i + 1];
    else if (strcmp(argv[i], "--durability") == 0)
      durability = strcmp(argv[i + 1], "relaxed") == 0 ? PMHASH_DURABILITY_RELAXED : PMHASH_DURABILITY_STRICT;
    else {
      fprintf(stderr, "usage: %s --engine E --keys N [--pool DIR] [--durability strict|relaxed]\n", argv[0]);
      return 2;
    }
  }
  if (n == 0 || (argc % 2) == 0) {
    fprintf(stderr, "usage: %s --engine E --keys N [--pool DIR] [--durability strict|relaxed]\n", argv[0]);
    return 2;
  }

  char path[4096];
  snprintf(path, sizeof path, "%s/pmhash-c-bench-%ld.pool", pool_dir, (long)getpid());
  unlink(path);
  /* The Rust benchmark's pool sizes for a grown table: a 64 MiB file that
   * may grow to 16 times the size a pre-sized table would take. */
  uint64_t presized = (64 * MIB + n * 128 + MIB - 1) / MIB * MIB;
  pmhash_index_options *o = pmhash_index_options_new();
  pmhash_status st;
  if ((st = pmhash_index_options_engine(o, engine)) != PMHASH_STATUS_OK) die("engine", st);
  if ((st = pmhash_index_options_durability(o, durability)) != PMHASH_STATUS_OK) die("durability", st);
  if ((st = pmhash_index_options_pool_size(o, 64 * MIB)) != PMHASH_STATUS_OK) die("pool size", st);
  if ((st = pmhash_index_options_max_pool_size(o, presized * 16)) != PMHASH_STATUS_OK) die("max pool size", st);

  uint64_t *loaded = malloc(n * sizeof *loaded);
  uint64_t *stream = malloc(n * sizeof *stream);
  if (loaded == NULL || stream == NULL) {
    fprintf(stderr, "not enough memory for %llu keys\n", (unsigned long long)n);
    return 1;
  }
  for (uint64_t i = 0; i < n; i++) loaded[i] = key_of(i);

  pmhash_index *ix = fresh(path, o, NULL, 0);
  double t0 = now();
  for (uint64_t i = 0; i < n; i++) {
    st = pmhash_index_insert(ix, loaded[i], value_of(loaded[i]));
    if (st != PMHASH_STATUS_OK) die("insert", st);
  }
  report("insert", engine, n, now() - t0);
  done(ix, path);

  uint64_t rng = 0x243F6A8885A308D3ull;
  for (uint64_t i = 0; i < n; i++) stream[i] = loaded[mix64(rng + i) % n];
  ix = fresh(path, o, loaded, n);
  t0 = now();
  for (uint64_t i = 0; i < n; i++) {
    uint64_t v = 0;
    st = pmhash_index_get(ix, stream[i], &v);
    if (st != PMHASH_STATUS_OK || v != value_of(stream[i])) die("get-pos", st);
  }
  report("get-pos", engine, n, now() - t0);
  done(ix, path);

  /* Absent keys: numbers n .. 2n-1 of the same bijection. */
  for (uint64_t i = 0; i < n; i++) stream[i] = key_of(n + mix64(rng ^ (i + 1)) % n);
  ix = fresh(path, o, loaded, n);
  t0 = now();
  for (uint64_t i = 0; i < n; i++) {
    uint64_t v;
    st = pmhash_index_get(ix, stream[i], &v);
    if (st != PMHASH_STATUS_NOT_FOUND) die("get-neg", st);
  }
  report("get-neg", engine, n, now() - t0);
  done(ix, path);

  ix = fresh(path, o, loaded, n);
  t0 = now();
  for (uint64_t i = 0; i < n; i++) {
    st = pmhash_index_remove(ix, loaded[i]);
    if (st != PMHASH_STATUS_OK) die("delete", st);
  }
  report("delete", engine, n, now() - t0);

  uint64_t len = 1;
  if ((st = pmhash_index_len(ix, &len)) != PMHASH_STATUS_OK || len != 0) die("len after delete", st);
  t0 = now();
  uint64_t named = 0;
  for (uint64_t i = 0; i < n; i++) {
    /* The volatile read keeps the compiler from hoisting the call. */
    const pmhash_index *volatile handle = ix;
    named += pmhash_index_engine(handle) != NULL;
  }
  double seconds = now() - t0;
  if (named != n) die("engine name", PMHASH_STATUS_OK);
  report("call", engine, n, seconds);
  printf("boundary: %.1f ns per call (pmhash_index_engine)\n", seconds / (double)n * 1e9);
  done(ix, path);
  pmhash_index_options_free(o);
  free(loaded);
  free(stream);
  return 0;
}
