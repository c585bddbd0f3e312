/*
 * malloc_trim_race: glibc's malloc_trim called for the first time from several threads at once in
 * a process whose malloc is another allocator's (tcmalloc, jemalloc preloaded): glibc never set up
 * its arenas, malloc_trim does it lazily and marks them ready before their bins are, so a second
 * thread walks empty bins (SIGSEGV at address 8, or an abort).
 *
 * Why it is here: tests/criu/progs/alloc_stress.c did exactly that after a restore under tcmalloc,
 * and one CI run failed on it (test_allocators[tcmalloc-stock]: "segfault at 8 ... in
 * libc.so.6" = malloc_trim+0xd1). Not CRIU's fault, and not a path of ours: the sleep worker's
 * trim_heap calls malloc_trim once, from one thread.
 *
 *   gcc -O2 -pthread -o /tmp/trimrace experiments/malloc_trim_race.c
 *   for i in $(seq 2000); do LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 /tmp/trimrace || echo x; done | wc -l
 *
 * Intel AMX VM, 2026-12-06: 296 of 2000 runs crashed under tcmalloc, 0 of 500 under glibc's malloc.
 */
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>

static pthread_barrier_t go;

static void *trim(void *arg)
{
	pthread_barrier_wait(&go);
	malloc_trim(0);
	return arg;
}

int main(void)
{
	pthread_t th[8];

	pthread_barrier_init(&go, NULL, 8);
	for (int i = 0; i < 8; i++)
		pthread_create(&th[i], NULL, trim, NULL);
	for (int i = 0; i < 8; i++)
		pthread_join(th[i], NULL);
	return 0;
}
