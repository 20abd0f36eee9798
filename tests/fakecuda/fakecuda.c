/* A stand-in for libcuda.so with the driver entry points the tracer probes, for testing the
 * uprobe plumbing on machines without a GPU. The synchronizing calls block for a known time;
 * cuMemcpyDtoH_v2 calls cuStreamSynchronize through the PLT, as the real library may call its
 * own exported functions, so the probes see a nested call. */
#include <setjmp.h>
#include <stddef.h>
#include <time.h>

static jmp_buf escape;

static void block_us(long us) {
    struct timespec t = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&t, NULL);
}

static void spin_us(long us) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) * 1000000L + (now.tv_nsec - start.tv_nsec) / 1000 < us);
}

int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shmem, void *stream, void **params, void **extra) {
    return 0;
}

/* Sleeps like a blocking-sync context would. The stream (void *)1 leaves by longjmp instead of
 * returning (fake_lost_return). */
int cuStreamSynchronize(void *stream) {
    block_us(2000);
    if (stream == (void *)1)
        longjmp(escape, 1);
    return 0;
}

/* n frames of 256 bytes deeper, then a cuStreamSynchronize left by longjmp. */
static int deep(int n) {
    volatile char pad[256];
    pad[0] = (char)n;
    if (n > 0)
        return deep(n - 1) + pad[0] * 0;
    if (setjmp(escape) == 0)
        cuStreamSynchronize((void *)1);
    return 0;
}

/* Enters cuStreamSynchronize deep in the stack and leaves it without a return, as an exception
 * or a longjmp out of a callback would: its return probe never fires, and the probes must not
 * take the thread's later calls, made from shallower frames, for calls nested in it. */
int fake_lost_return(void) {
    return deep(64);
}

/* Spins like the default spin-wait would: the thread stays on a CPU while it waits. */
int cuCtxSynchronize(void) {
    spin_us(1000);
    return 0;
}

int cuEventSynchronize(void *event) {
    block_us(500);
    return 0;
}

int cuMemcpyDtoH_v2(void *dst, unsigned long long src, size_t bytes) {
    spin_us(200);
    return cuStreamSynchronize(NULL);
}
