/*
 * The C API from C: every function, on good and bad input, and a reopen
 * after kill -9 of a child that was writing. Run by tests/c.rs as
 *     test SCRATCH_DIR
 * Exits 0 when every check holds; prints the first failed check and exits
 * 1 otherwise.
 */
#define _GNU_SOURCE
#include <pmhash.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *scratch;
static int checks;

#define CHECK(cond)                                                            \
  do {                                                                         \
    checks++;                                                                  \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n  last error: %s\n", __FILE__, \
              __LINE__, #cond, pmhash_last_error());                           \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

/* `call` returns `want`. */
#define EXPECT(call, want)                                                     \
  do {                                                                         \
    pmhash_status got_ = (call);                                               \
    checks++;                                                                  \
    if (got_ != (want)) {                                                      \
      fprintf(stderr, "%s:%d: %s returned %s, expected %s\n  last error: %s\n", \
              __FILE__, __LINE__, #call, pmhash_status_name(got_),             \
              pmhash_status_name(want), pmhash_last_error());                  \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

/* `call` fails with `want` and a message that contains `words`. */
#define EXPECT_ERR(call, want, words)                                          \
  do {                                                                         \
    EXPECT(call, want);                                                        \
    if (strstr(pmhash_last_error(), (words)) == NULL) {                        \
      fprintf(stderr, "%s:%d: message of %s lacks \"%s\": %s\n", __FILE__,     \
              __LINE__, #call, (words), pmhash_last_error());                  \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static char *path_of(const char *name) {
  static char buf[8][4096];
  static int next;
  char *p = buf[next++ % 8];
  snprintf(p, sizeof buf[0], "%s/%s", scratch, name);
  return p;
}

static uint64_t value_of(uint64_t key) { return key * 0x9E3779B97F4A7C15ull + 1; }

/* ---- the boundary's own functions ---- */

static void test_boundary(void) {
  CHECK(strcmp(pmhash_status_name(PMHASH_STATUS_OK), "PMHASH_STATUS_OK") == 0);
  CHECK(strcmp(pmhash_status_name(PMHASH_STATUS_OUT_OF_SPACE), "PMHASH_STATUS_OUT_OF_SPACE") == 0);
  CHECK(strcmp(pmhash_status_name(42), "unknown status") == 0);
  CHECK(strcmp(pmhash_version(), "0.1.0") == 0);
  /* A panic inside the library comes back as a status with its message. */
  EXPECT_ERR(pmhash_debug_panic(), PMHASH_STATUS_PANIC, "pmhash_debug_panic was called");
  /* And the library goes on working after it. */
  EXPECT_ERR(pmhash_debug_panic(), PMHASH_STATUS_PANIC, "panic inside pmhash");
  pmhash_bytes none = {NULL, 0};
  pmhash_bytes_free(&none);
  pmhash_bytes_free(NULL);
}

/* ---- indexes ---- */

static void test_index_options(void) {
  pmhash_index_options *o = pmhash_index_options_new();
  CHECK(o != NULL);
  EXPECT(pmhash_index_options_engine(o, "hmeh"), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_options_durability(o, PMHASH_DURABILITY_RELAXED), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_options_expected_keys(o, 1000), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_options_threads(o, 2), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_options_pool_size(o, 8 << 20), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_options_max_pool_size(o, 64 << 20), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_options_mode(o, PMHASH_MODE_MAPPED), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_options_read_only(o, false), PMHASH_STATUS_OK);
  /* Bad values. */
  EXPECT_ERR(pmhash_index_options_durability(o, 7), PMHASH_STATUS_INVALID_ARGUMENT, "durability");
  EXPECT_ERR(pmhash_index_options_mode(o, 9), PMHASH_STATUS_INVALID_ARGUMENT, "mode");
  EXPECT_ERR(pmhash_index_options_threads(o, 0), PMHASH_STATUS_INVALID_ARGUMENT, "threads");
  EXPECT_ERR(pmhash_index_options_engine(o, NULL), PMHASH_STATUS_INVALID_ARGUMENT, "NULL");
  EXPECT_ERR(pmhash_index_options_engine(o, "\xff\xfe"), PMHASH_STATUS_INVALID_ARGUMENT, "UTF-8");
  EXPECT_ERR(pmhash_index_options_engine(o, ""), PMHASH_STATUS_INVALID_ARGUMENT, "empty");
  /* NULL options. */
  EXPECT_ERR(pmhash_index_options_engine(NULL, "pass"), PMHASH_STATUS_INVALID_ARGUMENT, "options is NULL");
  EXPECT(pmhash_index_options_durability(NULL, 0), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_index_options_expected_keys(NULL, 1), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_index_options_threads(NULL, 1), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_index_options_pool_size(NULL, 1), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_index_options_max_pool_size(NULL, 1), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_index_options_mode(NULL, 0), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_index_options_read_only(NULL, true), PMHASH_STATUS_INVALID_ARGUMENT);

  /* The options made an hmeh index with relaxed durability. */
  pmhash_index *ix = NULL;
  EXPECT(pmhash_index_create(path_of("opts.pool"), o, &ix), PMHASH_STATUS_OK);
  CHECK(strcmp(pmhash_index_engine(ix), "hmeh") == 0);
  for (uint64_t k = 0; k < 5000; k++) EXPECT(pmhash_index_insert(ix, k, value_of(k)), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_sync(ix), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_close(ix), PMHASH_STATUS_OK);
  pmhash_index_options_free(o);
  pmhash_index_options_free(NULL);

  /* An unknown engine is refused at create, and leaves no file. */
  o = pmhash_index_options_new();
  EXPECT(pmhash_index_options_engine(o, "no-such-engine"), PMHASH_STATUS_OK);
  ix = (pmhash_index *)&ix; /* set to NULL by the refused create */
  EXPECT_ERR(pmhash_index_create(path_of("unknown.pool"), o, &ix), PMHASH_STATUS_INVALID_ARGUMENT, "no-such-engine");
  CHECK(ix == NULL);
  CHECK(access(path_of("unknown.pool"), F_OK) != 0);
  pmhash_index_options_free(o);
}

static void test_index(void) {
  const char *path = path_of("index.pool");
  pmhash_index *ix = NULL;
  EXPECT(pmhash_index_create(path, NULL, &ix), PMHASH_STATUS_OK);
  CHECK(strcmp(pmhash_index_engine(ix), "pass") == 0);

  uint64_t keys[] = {0, 1, 2, 42, UINT64_MAX - 1, UINT64_MAX};
  size_t n = sizeof keys / sizeof keys[0];
  for (size_t i = 0; i < n; i++) EXPECT(pmhash_index_insert(ix, keys[i], value_of(keys[i])), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_insert(ix, 42, 7), PMHASH_STATUS_EXISTS);
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    EXPECT(pmhash_index_get(ix, keys[i], &v), PMHASH_STATUS_OK);
    CHECK(v == value_of(keys[i]));
  }
  v = 12345;
  EXPECT(pmhash_index_get(ix, 3, &v), PMHASH_STATUS_NOT_FOUND);
  CHECK(v == 12345);
  EXPECT(pmhash_index_update(ix, 42, 4242), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_update(ix, 3, 1), PMHASH_STATUS_NOT_FOUND);
  EXPECT(pmhash_index_upsert(ix, 3, 33), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_upsert(ix, 3, 34), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_remove(ix, 1), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_remove(ix, 1), PMHASH_STATUS_NOT_FOUND);
  uint64_t len = 0;
  EXPECT(pmhash_index_len(ix, &len), PMHASH_STATUS_OK);
  CHECK(len == n); /* 6 inserted, 1 removed, 1 upserted */
  pmhash_index_stats st;
  memset(&st, 0xff, sizeof st);
  EXPECT(pmhash_index_get_stats(ix, &st), PMHASH_STATUS_OK);
  CHECK(st.len == n && st.capacity >= n && st.load_factor > 0 && st.load_factor <= 1 && st.pm_bytes > 0);

  /* NULL handles and out-pointers. */
  EXPECT_ERR(pmhash_index_insert(NULL, 1, 1), PMHASH_STATUS_INVALID_ARGUMENT, "handle is NULL");
  EXPECT(pmhash_index_get(NULL, 1, &v), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT_ERR(pmhash_index_get(ix, 1, NULL), PMHASH_STATUS_INVALID_ARGUMENT, "NULL");
  EXPECT(pmhash_index_update(NULL, 1, 1), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_index_upsert(NULL, 1, 1), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_index_remove(NULL, 1), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_index_len(NULL, &len), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_index_len(ix, NULL), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_index_get_stats(NULL, &st), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_index_get_stats(ix, NULL), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_index_sync(NULL), PMHASH_STATUS_INVALID_ARGUMENT);
  CHECK(pmhash_index_engine(NULL) == NULL);
  EXPECT(pmhash_index_close(NULL), PMHASH_STATUS_INVALID_ARGUMENT);

  /* A second writer of an open pool is refused. */
  pmhash_index *second = NULL;
  EXPECT(pmhash_index_open(path, NULL, &second), PMHASH_STATUS_POOL);
  CHECK(second == NULL && strlen(pmhash_last_error()) > 0);
  /* create on an existing file is refused. */
  CHECK(pmhash_index_create(path, NULL, &second) < 0 && second == NULL);
  EXPECT(pmhash_index_close(ix), PMHASH_STATUS_OK);

  /* Reopen (nameless: the pool says which engine), then by open_or_create. */
  EXPECT(pmhash_index_open(path, NULL, &ix), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_get(ix, 42, &v), PMHASH_STATUS_OK);
  CHECK(v == 4242);
  EXPECT(pmhash_index_get(ix, 3, &v), PMHASH_STATUS_OK);
  CHECK(v == 34);
  EXPECT(pmhash_index_get(ix, 1, &v), PMHASH_STATUS_NOT_FOUND);
  EXPECT(pmhash_index_close(ix), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_open_or_create(path, NULL, &ix), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_len(ix, &len), PMHASH_STATUS_OK);
  CHECK(len == n);
  EXPECT(pmhash_index_close(ix), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_open_or_create(path_of("fresh.pool"), NULL, &ix), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_len(ix, &len), PMHASH_STATUS_OK);
  CHECK(len == 0);
  EXPECT(pmhash_index_close(ix), PMHASH_STATUS_OK);

  /* Read-only: reads work, writes are refused, the file is not written. */
  pmhash_index_options *ro = pmhash_index_options_new();
  EXPECT(pmhash_index_options_read_only(ro, true), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_open(path, ro, &ix), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_get(ix, 42, &v), PMHASH_STATUS_OK);
  EXPECT_ERR(pmhash_index_insert(ix, 1000, 1), PMHASH_STATUS_INVALID_ARGUMENT, "read-only");
  EXPECT_ERR(pmhash_index_update(ix, 42, 1), PMHASH_STATUS_INVALID_ARGUMENT, "read-only");
  EXPECT_ERR(pmhash_index_upsert(ix, 1000, 1), PMHASH_STATUS_INVALID_ARGUMENT, "read-only");
  EXPECT_ERR(pmhash_index_remove(ix, 42), PMHASH_STATUS_INVALID_ARGUMENT, "read-only");
  EXPECT(pmhash_index_close(ix), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_open(path, NULL, &ix), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_get(ix, 1000, &v), PMHASH_STATUS_NOT_FOUND);
  EXPECT(pmhash_index_get(ix, 42, &v), PMHASH_STATUS_OK);
  CHECK(v == 4242);
  EXPECT(pmhash_index_close(ix), PMHASH_STATUS_OK);
  CHECK(pmhash_index_create(path_of("ro.pool"), ro, &ix) == PMHASH_STATUS_INVALID_ARGUMENT);
  pmhash_index_options_free(ro);

  /* Bad paths and out-pointers. */
  EXPECT_ERR(pmhash_index_open(NULL, NULL, &ix), PMHASH_STATUS_INVALID_ARGUMENT, "path is NULL");
  EXPECT_ERR(pmhash_index_create("/tmp/\xff\xfe.pool", NULL, &ix), PMHASH_STATUS_INVALID_ARGUMENT, "UTF-8");
  EXPECT_ERR(pmhash_index_open("", NULL, &ix), PMHASH_STATUS_INVALID_ARGUMENT, "empty");
  EXPECT_ERR(pmhash_index_open(path, NULL, NULL), PMHASH_STATUS_INVALID_ARGUMENT, "out-pointer");
  EXPECT(pmhash_index_open_or_create(NULL, NULL, &ix), PMHASH_STATUS_INVALID_ARGUMENT);
  CHECK(pmhash_index_open(path_of("missing.pool"), NULL, &ix) < 0 && ix == NULL);
}

/* A file that is not a pool is refused, and left as it was. */
static void test_foreign_file(void) {
  const char *path = path_of("foreign.txt");
  char text[65536];
  for (size_t i = 0; i < sizeof text; i++) text[i] = "not a pool\n"[i % 11];
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL && fwrite(text, 1, sizeof text, f) == sizeof text && fclose(f) == 0);
  pmhash_index *ix = (pmhash_index *)&ix;
  pmhash_status st = pmhash_index_open(path, NULL, &ix);
  CHECK(st == PMHASH_STATUS_POOL || st == PMHASH_STATUS_CORRUPT);
  CHECK(ix == NULL && strlen(pmhash_last_error()) > 0);
  char back[sizeof text + 1];
  f = fopen(path, "rb");
  CHECK(f != NULL && fread(back, 1, sizeof back, f) == sizeof text && fclose(f) == 0);
  CHECK(memcmp(back, text, sizeof text) == 0);
}

/* A pool that cannot grow fills up: out of space, and still usable. */
static void test_full_pool(void) {
  pmhash_index_options *o = pmhash_index_options_new();
  EXPECT(pmhash_index_options_engine(o, "hmeh"), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_options_pool_size(o, 4 << 20), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_options_max_pool_size(o, 4 << 20), PMHASH_STATUS_OK);
  pmhash_index *ix = NULL;
  EXPECT(pmhash_index_create(path_of("full.pool"), o, &ix), PMHASH_STATUS_OK);
  pmhash_index_options_free(o);
  uint64_t k = 0;
  pmhash_status st;
  while ((st = pmhash_index_insert(ix, k, value_of(k))) == PMHASH_STATUS_OK) {
    k++;
    CHECK(k < 10000000);
  }
  EXPECT_ERR(st, PMHASH_STATUS_OUT_OF_SPACE, "out of space");
  CHECK(k > 1000);
  uint64_t v = 0;
  EXPECT(pmhash_index_get(ix, k - 1, &v), PMHASH_STATUS_OK);
  CHECK(v == value_of(k - 1));
  EXPECT(pmhash_index_get(ix, k, &v), PMHASH_STATUS_NOT_FOUND);
  EXPECT(pmhash_index_remove(ix, 0), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_close(ix), PMHASH_STATUS_OK);
  EXPECT(pmhash_index_open(path_of("full.pool"), NULL, &ix), PMHASH_STATUS_OK);
  uint64_t len = 0;
  EXPECT(pmhash_index_len(ix, &len), PMHASH_STATUS_OK);
  CHECK(len == k - 1);
  EXPECT(pmhash_index_close(ix), PMHASH_STATUS_OK);
}

/* ---- stores ---- */

/* A store whose pool cannot grow fills up: out of space, and still
 * usable. */
static void test_full_store(void) {
  pmhash_store_options *o = pmhash_store_options_new();
  EXPECT(pmhash_store_options_pool_size(o, 64 << 20), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_options_max_pool_size(o, 64 << 20), PMHASH_STATUS_OK);
  pmhash_store *s = NULL;
  EXPECT(pmhash_store_open(path_of("full-store"), o, &s), PMHASH_STATUS_OK);
  static uint8_t value[4096];
  uint64_t k = 0;
  pmhash_status st;
  for (;;) {
    memcpy(value, &k, sizeof k);
    st = pmhash_store_put(s, (const uint8_t *)&k, sizeof k, value, sizeof value);
    if (st != PMHASH_STATUS_OK) break;
    k++;
    CHECK(k < 1000000);
  }
  EXPECT_ERR(st, PMHASH_STATUS_OUT_OF_SPACE, "out of space");
  CHECK(k > 0);
  uint64_t first = 0, len = 0;
  pmhash_bytes got = {NULL, 0};
  EXPECT(pmhash_store_get(s, (const uint8_t *)&first, sizeof first, &got), PMHASH_STATUS_OK);
  CHECK(got.len == sizeof value);
  pmhash_bytes_free(&got);
  EXPECT(pmhash_store_len(s, &len), PMHASH_STATUS_OK);
  CHECK(len == k);
  EXPECT(pmhash_store_delete(s, (const uint8_t *)&first, sizeof first), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_close(s), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_open(path_of("full-store"), o, &s), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_len(s, &len), PMHASH_STATUS_OK);
  CHECK(len == k - 1);
  EXPECT(pmhash_store_close(s), PMHASH_STATUS_OK);
  pmhash_store_options_free(o);
  printf("full store: %llu puts of 4 KiB before out of space\n", (unsigned long long)k);
}

struct seen {
  int count;
  int stop_after;
  char keys[16][16];
};

static int collect(void *context, const uint8_t *key, size_t key_len, const uint8_t *value, size_t value_len) {
  struct seen *s = context;
  if (key_len >= 16 || value_len != key_len || memcmp(key, value, key_len) != 0) return 1;
  memcpy(s->keys[s->count], key, key_len);
  s->keys[s->count][key_len] = 0;
  s->count++;
  return s->count == s->stop_after;
}

#define B(s) (const uint8_t *)(s), strlen(s)

static void test_store(void) {
  const char *dir = path_of("store");
  pmhash_store_options *o = pmhash_store_options_new();
  CHECK(o != NULL);
  EXPECT(pmhash_store_options_durability(o, PMHASH_DURABILITY_STRICT), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_options_pool_size(o, 32 << 20), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_options_max_pool_size(o, 128 << 20), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_options_expected_keys(o, 1000), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_options_cache_bytes(o, 1 << 20), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_options_mode(o, PMHASH_MODE_MAPPED), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_options_read_only(o, false), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_options_log_clusters(o, 16), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_options_log_file_size(o, 2 << 20), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_options_log_clusters(NULL, 1), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_options_log_file_size(NULL, 1), PMHASH_STATUS_INVALID_ARGUMENT);
  {
    /* Log geometry is checked when the store opens. */
    pmhash_store_options *bad = pmhash_store_options_new();
    CHECK(bad != NULL);
    EXPECT(pmhash_store_options_log_clusters(bad, 0), PMHASH_STATUS_OK);
    pmhash_store *none = NULL;
    char bad_dir[4096];
    snprintf(bad_dir, sizeof bad_dir, "%s/store-bad-geometry", scratch);
    EXPECT_ERR(pmhash_store_open(bad_dir, bad, &none), PMHASH_STATUS_INVALID_ARGUMENT, "clusters");
    CHECK(none == NULL);
    pmhash_store_options_free(bad);
  }
  EXPECT(pmhash_store_options_durability(o, 2), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_options_mode(o, 2), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_options_durability(NULL, 0), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_options_pool_size(NULL, 1), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_options_max_pool_size(NULL, 1), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_options_expected_keys(NULL, 1), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_options_cache_bytes(NULL, 1), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_options_mode(NULL, 0), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_options_read_only(NULL, true), PMHASH_STATUS_INVALID_ARGUMENT);

  pmhash_store *s = NULL;
  EXPECT(pmhash_store_open(dir, o, &s), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_put(s, B("banana"), B("banana")), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_put(s, B("apple"), B("xx")), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_put(s, B("apple"), B("apple")), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_insert(s, B("cherry"), B("cherry")), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_insert(s, B("cherry"), B("other")), PMHASH_STATUS_EXISTS);
  EXPECT(pmhash_store_update(s, B("date"), B("date")), PMHASH_STATUS_NOT_FOUND);
  EXPECT(pmhash_store_insert(s, B("date"), B("d")), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_update(s, B("date"), B("date")), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_put(s, B("elder"), B("elder")), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_put(s, B("empty"), NULL, 0), PMHASH_STATUS_OK);

  pmhash_bytes got = {NULL, 0};
  EXPECT(pmhash_store_get(s, B("apple"), &got), PMHASH_STATUS_OK);
  CHECK(got.len == 5 && memcmp(got.data, "apple", 5) == 0);
  pmhash_bytes_free(&got);
  CHECK(got.data == NULL && got.len == 0);
  EXPECT(pmhash_store_get(s, B("empty"), &got), PMHASH_STATUS_OK);
  CHECK(got.data == NULL && got.len == 0);
  EXPECT(pmhash_store_get(s, B("fig"), &got), PMHASH_STATUS_NOT_FOUND);
  CHECK(got.data == NULL && got.len == 0);
  EXPECT(pmhash_store_delete(s, B("empty")), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_delete(s, B("empty")), PMHASH_STATUS_NOT_FOUND);

  /* Scans: in key order, bounded, stopped by the callback. */
  struct seen seen = {0, 0, {{0}}};
  EXPECT(pmhash_store_scan(s, NULL, 0, NULL, 0, 100, collect, &seen), PMHASH_STATUS_OK);
  CHECK(seen.count == 5);
  CHECK(strcmp(seen.keys[0], "apple") == 0 && strcmp(seen.keys[4], "elder") == 0);
  memset(&seen, 0, sizeof seen);
  EXPECT(pmhash_store_scan(s, B("b"), B("d"), 100, collect, &seen), PMHASH_STATUS_OK);
  CHECK(seen.count == 2 && strcmp(seen.keys[0], "banana") == 0 && strcmp(seen.keys[1], "cherry") == 0);
  memset(&seen, 0, sizeof seen);
  EXPECT(pmhash_store_scan(s, B("a"), NULL, 0, 2, collect, &seen), PMHASH_STATUS_OK);
  CHECK(seen.count == 2);
  memset(&seen, 0, sizeof seen);
  seen.stop_after = 3;
  EXPECT(pmhash_store_scan(s, NULL, 0, NULL, 0, 100, collect, &seen), PMHASH_STATUS_OK);
  CHECK(seen.count == 3);

  uint64_t len = 0;
  EXPECT(pmhash_store_len(s, &len), PMHASH_STATUS_OK);
  CHECK(len == 5);
  pmhash_store_stats st;
  memset(&st, 0, sizeof st);
  EXPECT(pmhash_store_get_stats(s, &st), PMHASH_STATUS_OK);
  CHECK(st.keys == 5 && st.files >= 1 && st.log_bytes >= st.live_bytes && st.live_bytes > 0 && st.pm_bytes > 0);
  EXPECT(pmhash_store_sync(s), PMHASH_STATUS_OK);

  /* Bad input. */
  static uint8_t big[PMHASH_MAX_VALUE + 1];
  EXPECT_ERR(pmhash_store_put(s, NULL, 5, B("v")), PMHASH_STATUS_INVALID_ARGUMENT, "key is NULL");
  EXPECT_ERR(pmhash_store_put(s, B("k"), NULL, 3), PMHASH_STATUS_INVALID_ARGUMENT, "value is NULL");
  EXPECT_ERR(pmhash_store_put(s, big, PMHASH_MAX_KEY + 1, B("v")), PMHASH_STATUS_INVALID_ARGUMENT, "key");
  EXPECT_ERR(pmhash_store_put(s, B("k"), big, PMHASH_MAX_VALUE + 1), PMHASH_STATUS_INVALID_ARGUMENT, "value");
  EXPECT_ERR(pmhash_store_put(s, B("k"), big, SIZE_MAX), PMHASH_STATUS_INVALID_ARGUMENT, "out of range");
  EXPECT(pmhash_store_put(NULL, B("k"), B("v")), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_insert(NULL, B("k"), B("v")), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_insert(s, NULL, 1, B("v")), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_update(NULL, B("k"), B("v")), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_update(s, B("apple"), NULL, 1), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_get(NULL, B("k"), &got), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT_ERR(pmhash_store_get(s, B("k"), NULL), PMHASH_STATUS_INVALID_ARGUMENT, "out-pointer");
  EXPECT(pmhash_store_get(s, NULL, 2, &got), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_delete(NULL, B("k")), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_delete(s, NULL, 2), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT_ERR(pmhash_store_scan(s, NULL, 0, NULL, 0, 10, NULL, NULL), PMHASH_STATUS_INVALID_ARGUMENT, "callback");
  EXPECT(pmhash_store_scan(NULL, NULL, 0, NULL, 0, 10, collect, &seen), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_scan(s, NULL, 1, NULL, 0, 10, collect, &seen), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_scan(s, NULL, 0, NULL, 1, 10, collect, &seen), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_len(NULL, &len), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_len(s, NULL), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_get_stats(NULL, &st), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_get_stats(s, NULL), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_sync(NULL), PMHASH_STATUS_INVALID_ARGUMENT);
  EXPECT(pmhash_store_close(NULL), PMHASH_STATUS_INVALID_ARGUMENT);
  /* The refused writes changed nothing. */
  EXPECT(pmhash_store_len(s, &len), PMHASH_STATUS_OK);
  CHECK(len == 5);

  /* A second writer is refused; bad directories are refused. */
  pmhash_store *second = (pmhash_store *)&second;
  EXPECT(pmhash_store_open(dir, NULL, &second), PMHASH_STATUS_POOL);
  CHECK(second == NULL);
  EXPECT_ERR(pmhash_store_open(NULL, NULL, &second), PMHASH_STATUS_INVALID_ARGUMENT, "directory is NULL");
  EXPECT_ERR(pmhash_store_open("/tmp/\xc3\x28", NULL, &second), PMHASH_STATUS_INVALID_ARGUMENT, "UTF-8");
  EXPECT_ERR(pmhash_store_open(dir, NULL, NULL), PMHASH_STATUS_INVALID_ARGUMENT, "out-pointer");
  EXPECT(pmhash_store_close(s), PMHASH_STATUS_OK);

  /* Reopen: the same contents; read-only refuses writes. */
  EXPECT(pmhash_store_options_read_only(o, true), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_open(dir, o, &s), PMHASH_STATUS_OK);
  EXPECT(pmhash_store_get(s, B("date"), &got), PMHASH_STATUS_OK);
  CHECK(got.len == 4 && memcmp(got.data, "date", 4) == 0);
  pmhash_bytes_free(&got);
  CHECK(pmhash_store_put(s, B("fig"), B("fig")) < 0);
  EXPECT(pmhash_store_close(s), PMHASH_STATUS_OK);
  pmhash_store_options_free(o);
  pmhash_store_options_free(NULL);
}

/* ---- kill -9 of a writer ---- */

static int write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t w = write(fd, p, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

/* The child: opens, writes keys 0, 1, 2, ... and after each write has
 * returned, sends its number down the pipe; never closes. */
static void crash_child(int fd, int store) {
  pmhash_index *ix = NULL;
  pmhash_store *s = NULL;
  if (store) {
    if (pmhash_store_open(path_of("crash-store"), NULL, &s) != PMHASH_STATUS_OK) {
      fprintf(stderr, "writer: open: %s\n", pmhash_last_error());
      _exit(2);
    }
  } else if (pmhash_index_create(path_of("crash.pool"), NULL, &ix) != PMHASH_STATUS_OK) {
    _exit(2);
  }
  for (uint64_t k = 0;; k++) {
    pmhash_status st;
    if (store) {
      char key[32];
      uint64_t v = value_of(k);
      int n = snprintf(key, sizeof key, "key-%llu", (unsigned long long)k);
      st = pmhash_store_put(s, (const uint8_t *)key, (size_t)n, (const uint8_t *)&v, sizeof v);
    } else {
      st = pmhash_index_insert(ix, k, value_of(k));
    }
    if (st != PMHASH_STATUS_OK) {
      fprintf(stderr, "writer: write %llu: %s\n", (unsigned long long)k, pmhash_last_error());
      _exit(3);
    }
    if (write_all(fd, &k, sizeof k) != 0) _exit(4);
  }
}

static void test_kill9(int store) {
  int fds[2];
  CHECK(pipe(fds) == 0);
  fflush(stdout); /* the child must not print the parent's buffered output */
  fflush(stderr);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    crash_child(fds[1], store);
  }
  close(fds[1]);
  /* Let it write a while, then kill it mid-stream. */
  uint64_t acked = 0, k;
  const uint64_t target = store ? 20000 : 50000;
  while (acked < target) {
    ssize_t r = read(fds[0], &k, sizeof k);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) {
      int status = 0;
      waitpid(pid, &status, 0);
      fprintf(stderr, "the writer stopped by itself (wait status %#x) after %llu writes\n", status,
              (unsigned long long)acked);
    }
    CHECK(r == sizeof k);
    CHECK(k == acked);
    acked++;
  }
  CHECK(kill(pid, SIGKILL) == 0);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  /* Keys acknowledged before the kill that are still in the pipe count too. */
  for (;;) {
    ssize_t r = read(fds[0], &k, sizeof k);
    if (r == 0) break;
    CHECK(r == sizeof k && k == acked);
    acked++;
  }
  close(fds[0]);

  uint64_t len = 0;
  if (store) {
    pmhash_store *s = NULL;
    EXPECT(pmhash_store_open(path_of("crash-store"), NULL, &s), PMHASH_STATUS_OK);
    for (uint64_t i = 0; i < acked; i++) {
      char key[32];
      int n = snprintf(key, sizeof key, "key-%llu", (unsigned long long)i);
      pmhash_bytes got = {NULL, 0};
      EXPECT(pmhash_store_get(s, (const uint8_t *)key, (size_t)n, &got), PMHASH_STATUS_OK);
      uint64_t v;
      CHECK(got.len == sizeof v);
      memcpy(&v, got.data, sizeof v);
      CHECK(v == value_of(i));
      pmhash_bytes_free(&got);
    }
    EXPECT(pmhash_store_len(s, &len), PMHASH_STATUS_OK);
    EXPECT(pmhash_store_close(s), PMHASH_STATUS_OK);
  } else {
    pmhash_index *ix = NULL;
    EXPECT(pmhash_index_open(path_of("crash.pool"), NULL, &ix), PMHASH_STATUS_OK);
    for (uint64_t i = 0; i < acked; i++) {
      uint64_t v = 0;
      EXPECT(pmhash_index_get(ix, i, &v), PMHASH_STATUS_OK);
      CHECK(v == value_of(i));
    }
    EXPECT(pmhash_index_len(ix, &len), PMHASH_STATUS_OK);
    EXPECT(pmhash_index_close(ix), PMHASH_STATUS_OK);
  }
  /* At most the one write in flight at the kill is there unacknowledged. */
  CHECK(len == acked || len == acked + 1);
  printf("kill -9 (%s): %llu acknowledged writes, all there after reopen\n", store ? "store" : "index",
         (unsigned long long)acked);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
    return 2;
  }
  scratch = argv[1];
  /* The crash tests fork, so they run first, while this process has no
   * thread of the library's running. */
  test_kill9(0);
  test_kill9(1);
  test_boundary();
  test_index_options();
  test_index();
  test_foreign_file();
  test_full_pool();
  test_store();
  test_full_store();
  printf("%d checks passed\n", checks);
  return 0;
}
