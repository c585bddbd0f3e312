/*
 * memhold: a process that holds SIZE_MB of known pseudo-random data in one private anonymous
 * mapping, for CRIU round-trip tests and `coldstart bench criu`.
 *
 * Why a C program: its memory is exactly what we put there (no interpreter heap noise), the
 * digest runs at memory speed, and the pattern is seekable (word i = splitmix64(seed + i)), so
 * any range can be checked against "what the image holds" after a restore.
 *
 * Control channel (no fds held, so a restore never conflicts with the original process):
 * the caller writes CTLDIR/req ("NONCE CMD [ARGS]"), sends SIGUSR1; the program answers in
 * CTLDIR/resp ("NONCE RESULT...", written to a temp file and renamed).
 *   ping                -> "ok PID"
 *   digest              -> hash of every byte of the region (reads every page)
 *   touch               -> reads one word per page (cheap "read every page")
 *   verify              -> "ok" if the region still holds the seed's pattern, else first bad offset
 *   write SEED2         -> rewrites every page with SEED2's pattern (COW every page), new digest
 *   madv OFF LEN        -> madvise(MADV_DONTNEED) the range, then reads it back:
 *                          "zeros" | "image" (the original pattern) | "other OFFSET"
 * usage: memhold SIZE_MB SEED CTLDIR
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static uint8_t *region;
static size_t region_len;
static uint64_t seed;
static const char *ctl;

static inline uint64_t splitmix64(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

static void fill(uint64_t s)
{
	uint64_t *w = (uint64_t *)region;
	size_t n = region_len / 8;
	for (size_t i = 0; i < n; i++)
		w[i] = splitmix64(s + i);
}

static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t digest(void)
{
	const uint64_t *w = (const uint64_t *)region;
	size_t n = region_len / 8;
	uint64_t h[4] = {1, 2, 3, 4};
	for (size_t i = 0; i + 4 <= n; i += 4)
		for (int k = 0; k < 4; k++)
			h[k] = rotl(h[k] ^ w[i + k], 29) * 0x9E3779B97F4A7C15ull;
	return h[0] ^ rotl(h[1], 16) ^ rotl(h[2], 32) ^ rotl(h[3], 48) ^ region_len;
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

static void handle(void)
{
	char path[4096], line[512], nonce[64] = "?", cmd[64] = "";
	unsigned long long a = 0, b = 0;
	snprintf(path, sizeof(path), "%s/req", ctl);
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	if (!fgets(line, sizeof(line), f))
		line[0] = 0;
	fclose(f);
	sscanf(line, "%63s %63s %llu %llu", nonce, cmd, &a, &b);

	if (!strcmp(cmd, "ping")) {
		respond(nonce, "ok %d", getpid());
	} else if (!strcmp(cmd, "digest")) {
		respond(nonce, "%016" PRIx64, digest());
	} else if (!strcmp(cmd, "touch")) {
		volatile uint64_t acc = 0;
		for (size_t off = 0; off < region_len; off += 4096)
			acc += region[off];
		respond(nonce, "ok %" PRIu64, (uint64_t)acc);
	} else if (!strcmp(cmd, "verify")) {
		const uint64_t *w = (const uint64_t *)region;
		size_t n = region_len / 8, i;
		for (i = 0; i < n; i++)
			if (w[i] != splitmix64(seed + i))
				break;
		if (i == n)
			respond(nonce, "ok");
		else
			respond(nonce, "bad %zu", i * 8);
	} else if (!strcmp(cmd, "write")) {
		seed = a;
		fill(seed);
		respond(nonce, "%016" PRIx64, digest());
	} else if (!strcmp(cmd, "madv")) {
		size_t off = a & ~4095ull, len = (b + 4095) & ~4095ull;
		if (off + len > region_len || !len) {
			respond(nonce, "error range");
			return;
		}
		if (madvise(region + off, len, MADV_DONTNEED)) {
			respond(nonce, "error madvise %s", strerror(errno));
			return;
		}
		const uint64_t *w = (const uint64_t *)(region + off);
		size_t n = len / 8, i, zeros = 1, image = 1, bad = 0;
		for (i = 0; i < n; i++) {
			if (w[i] != 0)
				zeros = 0;
			if (w[i] != splitmix64(seed + off / 8 + i))
				image = 0;
			if (!zeros && !image) {
				bad = off + i * 8;
				break;
			}
		}
		if (zeros)
			respond(nonce, "zeros");
		else if (image)
			respond(nonce, "image");
		else
			respond(nonce, "other %zu", bad);
	} else {
		respond(nonce, "error unknown command '%s'", cmd);
	}
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: %s SIZE_MB SEED CTLDIR\n", argv[0]);
		return 2;
	}
	region_len = strtoull(argv[1], NULL, 0) << 20;
	seed = strtoull(argv[2], NULL, 0);
	ctl = argv[3];

	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	sigprocmask(SIG_BLOCK, &set, NULL);

	region = mmap(NULL, region_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (region == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	/* no THP: keeps the dumped layout page-granular and the restore comparable across runs */
	madvise(region, region_len, MADV_NOHUGEPAGE);
	fill(seed);
	respond("ready", "ok %d", getpid());

	for (;;) {
		int sig = sigwaitinfo(&set, NULL);
		if (sig == SIGUSR1)
			handle();
		else if (sig < 0 && errno != EINTR)
			return 1;
	}
}
