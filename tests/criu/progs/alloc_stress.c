/*
 * alloc_stress: checks that a restored process's allocator never hands out stale bytes.
 *
 * Why: an mmap restore backs private anonymous memory with a private mapping of pages-*.img.
 * On such a mapping MADV_DONTNEED brings the image bytes back instead of zeros, and allocators
 * release memory with MADV_DONTNEED (glibc trims heaps of thread arenas, malloc_trim, tcmalloc,
 * jemalloc). An allocator that assumes "released == zero" would then return non-zero calloc
 * memory. This program leaves dirty heap data (live chunks, freed garbage, a dirty top chunk) in
 * every arena BEFORE the dump, then, after the restore, frees everything, forces trims and
 * exercises calloc / malloc / realloc growth from several threads, checking every byte.
 *
 * Control (same protocol as memhold): CTLDIR/req "NONCE run SEED" + SIGUSR1 -> CTLDIR/resp
 * "NONCE ok ..." or "NONCE FAIL <what, where>".  usage: alloc_stress NTHREADS CTLDIR
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXW 16
#define MAXCH 4096
#define LIVE_CAP (40u << 20)

struct chunk { uint8_t *p; size_t n; uint64_t seed; };
struct worker {
	int id;
	uint64_t rng;
	struct chunk ch[MAXCH];
	int nch;
	size_t live;
	char fail[512];
	unsigned long callocs, reallocs, bytes_checked;
};

static struct worker W[MAXW];
static int nworkers;
static const char *ctl;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static unsigned long generation, done_count;
static uint64_t round_seed;

static inline uint64_t splitmix64(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}
static uint64_t rnd(struct worker *w) { return splitmix64(w->rng++); }

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
	size_t i;
	for (i = 0; i + 8 <= n; i += 8) {
		uint64_t v = splitmix64(seed + i);
		memcpy(p + i, &v, 8);
	}
	for (; i < n; i++)
		p[i] = (uint8_t)splitmix64(seed + i);
}

/* returns the first offset that differs from the pattern, or n */
static size_t check(const uint8_t *p, size_t n, uint64_t seed)
{
	size_t i;
	for (i = 0; i + 8 <= n; i += 8) {
		uint64_t v = splitmix64(seed + i);
		if (memcmp(p + i, &v, 8))
			break;
	}
	for (; i < n; i++)
		if (p[i] != (uint8_t)splitmix64(seed + i))
			return i;
	return n;
}

static size_t first_nonzero(const uint8_t *p, size_t n)
{
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		uint64_t v;
		memcpy(&v, p + i, 8);
		if (v)
			break;
	}
	for (; i < n; i++)
		if (p[i])
			return i;
	return n;
}

static void failf(struct worker *w, const char *fmt, ...)
{
	if (w->fail[0])
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(w->fail, sizeof(w->fail), fmt, ap);
	va_end(ap);
}

/* log-uniform size 16 B .. 4 MiB, sometimes above the mmap threshold */
static size_t pick_size(struct worker *w)
{
	uint64_t r = rnd(w);
	if (r % 50 == 0)
		return (12u << 20) + (r >> 40) % 4096;
	int shift = 4 + (r >> 8) % 19; /* 2^4 .. 2^22 */
	return ((size_t)1 << shift) + (r >> 32) % ((size_t)1 << shift);
}

static void release_memory(void)
{
	/* tcmalloc (gperftools) and jemalloc when preloaded */
	void (*tc_release)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "MallocExtension_ReleaseFreeMemory");
	int (*je_mallctl)(const char *, void *, size_t *, void *, size_t) =
		(int (*)(const char *, void *, size_t *, void *, size_t))dlsym(RTLD_DEFAULT, "mallctl");
	if (tc_release)
		tc_release();
	else if (je_mallctl)
		je_mallctl("arena.4096.purge", NULL, NULL, NULL, 0);
	else
		/*
		 * glibc: trims every arena's top and madvise(DONTNEED)s free pages inside them. Only
		 * when malloc is glibc's: under a preloaded allocator glibc's arenas are never set up,
		 * and malloc_trim sets them up lazily, marking them ready before their bins are: two
		 * workers' first calls at once then walk empty bins (a SIGSEGV at address 8 in
		 * malloc_trim, seen once in CI under tcmalloc).
		 */
		malloc_trim(0);
}

static void free_chunk(struct worker *w, int i)
{
	memset(w->ch[i].p, 0xA5, w->ch[i].n); /* freed memory holds garbage, not zeros */
	free(w->ch[i].p);
	w->live -= w->ch[i].n;
	w->ch[i] = w->ch[--w->nch];
}

static int add_chunk(struct worker *w, uint8_t *p, size_t n)
{
	if (!p) {
		failf(w, "worker %d: allocation of %zu bytes failed", w->id, n);
		return -1;
	}
	uint64_t seed = rnd(w);
	fill(p, n, seed);
	w->ch[w->nch++] = (struct chunk){p, n, seed};
	w->live += n;
	return 0;
}

static void verify_all(struct worker *w, const char *when)
{
	for (int i = 0; i < w->nch; i++) {
		size_t off = check(w->ch[i].p, w->ch[i].n, w->ch[i].seed);
		w->bytes_checked += w->ch[i].n;
		if (off != w->ch[i].n)
			failf(w, "worker %d: stale bytes %s in a live chunk of %zu bytes at offset %zu", w->id, when,
			      w->ch[i].n, off);
	}
}

/* before the dump: dirty live chunks, freed garbage and a dirty top chunk in this arena */
static void prepare(struct worker *w)
{
	while (w->live < LIVE_CAP / 2 && w->nch < MAXCH / 2) {
		size_t n = pick_size(w);
		if (n > (8u << 20))
			continue;
		if (add_chunk(w, malloc(n), n))
			return;
	}
	for (int i = w->nch - 1; i >= 0; i -= 2)
		free_chunk(w, i);
	/* two chunks above the mmap threshold: glibc grows these with mremap() after the restore */
	for (int k = 0; k < 2; k++) {
		size_t n = (12u << 20) + k * 4096 + 100;
		if (add_chunk(w, malloc(n), n))
			return;
	}
	size_t big = 6u << 20;
	uint8_t *p = malloc(big);
	if (p) {
		memset(p, 0x5A, big);
		free(p);
	}
}

/* grow every big live chunk 4x (mremap for mmapped chunks: must neither SIGBUS nor pull in
 * foreign bytes), check the old content and write the whole new size */
static void grow_big(struct worker *w)
{
	for (int i = 0; i < w->nch && !w->fail[0]; i++) {
		size_t old = w->ch[i].n, n = old * 4;
		if (old < (1u << 20))
			continue;
		uint8_t *p = realloc(w->ch[i].p, n);
		if (!p) {
			failf(w, "worker %d: realloc %zu -> %zu failed", w->id, old, n);
			return;
		}
		size_t off = check(p, old, w->ch[i].seed);
		w->reallocs++;
		w->bytes_checked += old;
		if (off != old)
			failf(w, "worker %d: growing a pre-dump chunk %zu -> %zu lost content at offset %zu", w->id, old,
			      n, off);
		w->ch[i].p = p;
		w->ch[i].n = n;
		w->ch[i].seed = rnd(w);
		fill(p, n, w->ch[i].seed);
		w->live += n - old;
	}
}

static void one_round(struct worker *w, uint64_t seed)
{
	w->rng ^= seed;
	verify_all(w, "after restore");
	grow_big(w);
	verify_all(w, "after growing pre-dump chunks");
	while (w->nch)
		free_chunk(w, w->nch - 1);
	release_memory();
	for (int k = 0; k < 400 && !w->fail[0]; k++) {
		uint64_t op = rnd(w) % 10;
		if ((w->live > LIVE_CAP || w->nch >= MAXCH - 1) && w->nch)
			op = 9;
		if (op <= 3) { /* calloc after frees and trims: every byte must be zero */
			size_t n = pick_size(w);
			uint8_t *p = calloc(1, n);
			if (!p) {
				failf(w, "worker %d: calloc(%zu) failed", w->id, n);
				break;
			}
			size_t off = first_nonzero(p, n);
			w->callocs++;
			w->bytes_checked += n;
			if (off != n)
				failf(w, "worker %d: calloc(%zu) returned non-zero byte 0x%02x at offset %zu", w->id, n,
				      p[off], off);
			add_chunk(w, p, n);
		} else if (op <= 5) {
			size_t n = pick_size(w);
			add_chunk(w, malloc(n), n);
		} else if (op <= 7 && w->nch) { /* realloc growth keeps the content */
			int i = rnd(w) % w->nch;
			size_t old = w->ch[i].n, n = old + old / 2 + 1 + rnd(w) % (old + 1);
			uint8_t *p = realloc(w->ch[i].p, n);
			if (!p) {
				failf(w, "worker %d: realloc to %zu failed", w->id, n);
				break;
			}
			size_t off = check(p, old, w->ch[i].seed);
			w->reallocs++;
			w->bytes_checked += old;
			if (off != old)
				failf(w, "worker %d: realloc %zu -> %zu lost content at offset %zu", w->id, old, n, off);
			w->ch[i].p = p;
			w->ch[i].n = n;
			w->ch[i].seed = rnd(w);
			fill(p, n, w->ch[i].seed);
			w->live += n - old;
		} else if (w->nch) {
			free_chunk(w, rnd(w) % w->nch);
			if (rnd(w) % 8 == 0)
				release_memory();
		}
	}
	verify_all(w, "at the end of a round");
}

static void *thread_main(void *arg)
{
	struct worker *w = arg;
	unsigned long seen = 0;
	prepare(w);
	pthread_mutex_lock(&mu);
	done_count++;
	pthread_cond_broadcast(&cv);
	for (;;) {
		while (generation == seen)
			pthread_cond_wait(&cv, &mu);
		seen = generation;
		uint64_t s = round_seed;
		pthread_mutex_unlock(&mu);
		one_round(w, s);
		pthread_mutex_lock(&mu);
		done_count++;
		pthread_cond_broadcast(&cv);
	}
	return NULL;
}

static void respond(const char *nonce, const char *fmt, ...)
{
	char tmp[4096], dst[4096];
	snprintf(tmp, sizeof(tmp), "%s/resp.tmp", ctl);
	snprintf(dst, sizeof(dst), "%s/resp", ctl);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return;
	fprintf(f, "%s ", nonce);
	va_list ap;
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	fputc('\n', f);
	fclose(f);
	rename(tmp, dst);
}

static void wait_threads(unsigned long target)
{
	pthread_mutex_lock(&mu);
	while (done_count < target)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s NTHREADS CTLDIR\n", argv[0]);
		return 2;
	}
	nworkers = atoi(argv[1]) + 1;
	if (nworkers < 2 || nworkers > MAXW)
		return 2;
	ctl = argv[2];

	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	sigprocmask(SIG_BLOCK, &set, NULL);

	/* before the dump: big chunks come from the arenas (not mmap) and nothing is trimmed, so the
	 * image holds dirty free memory and dirty top chunks in every arena */
	mallopt(M_MMAP_THRESHOLD, 8 << 20);
	mallopt(M_TRIM_THRESHOLD, 1 << 30);

	for (int i = 0; i < nworkers; i++) {
		W[i].id = i;
		W[i].rng = 0x1234567ull * (i + 1);
	}
	pthread_t th;
	for (int i = 1; i < nworkers; i++)
		if (pthread_create(&th, NULL, thread_main, &W[i]))
			return 1;
	prepare(&W[0]); /* the main thread works in glibc's main arena (brk heap) */
	wait_threads(nworkers - 1);
	respond("ready", "ok %d", getpid());

	for (;;) {
		int sig = sigwaitinfo(&set, NULL);
		if (sig != SIGUSR1)
			continue;
		char path[4096], line[256], nonce[64] = "?", cmd[64] = "";
		unsigned long long seed = 1;
		snprintf(path, sizeof(path), "%s/req", ctl);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		if (!fgets(line, sizeof(line), f))
			line[0] = 0;
		fclose(f);
		sscanf(line, "%63s %63s %llu", nonce, cmd, &seed);
		if (!strcmp(cmd, "ping")) {
			respond(nonce, "ok %d", getpid());
			continue;
		}
		if (strcmp(cmd, "run")) {
			respond(nonce, "error unknown command '%s'", cmd);
			continue;
		}
		/* after the restore: trim eagerly */
		mallopt(M_TRIM_THRESHOLD, 64 << 10);
		mallopt(M_TOP_PAD, 0);
		pthread_mutex_lock(&mu);
		done_count = 0;
		round_seed = seed;
		generation++;
		pthread_cond_broadcast(&cv);
		pthread_mutex_unlock(&mu);
		one_round(&W[0], seed);
		wait_threads(nworkers - 1);
		const char *fail = NULL;
		unsigned long c = 0, r = 0, b = 0;
		for (int i = 0; i < nworkers; i++) {
			if (W[i].fail[0] && !fail)
				fail = W[i].fail;
			c += W[i].callocs;
			r += W[i].reallocs;
			b += W[i].bytes_checked;
		}
		if (fail)
			respond(nonce, "FAIL %s", fail);
		else
			respond(nonce, "ok callocs=%lu reallocs=%lu bytes_checked=%lu", c, r, b);
	}
}
