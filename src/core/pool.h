/*
 * pool.h — the persistent worker threads shared by all calls: run fn(ctx,
 * task, worker) for task in [0, ntasks) on up to nthreads workers (the
 * caller's thread is worker 0). Tasks are claimed dynamically; callers make
 * results independent of which worker ran which task. Each worker runs a
 * job in the library's floating-point environment (fpenv.h), whatever the
 * environment of the thread that created it. One job at a time: a caller
 * that finds the pool busy runs its tasks alone. fork(): the child starts
 * with no workers and makes its own when it needs them.
 */
#ifndef BX_POOL_H
#define BX_POOL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BX_MAX_THREADS 256

typedef void (*bx_task_fn)(void *ctx, size_t task, int worker);

/* Returns the number of workers used (>= 1, <= nthreads). */
int bx_parallel_run(int nthreads, size_t ntasks, bx_task_fn fn, void *ctx);

/* The default thread count: BX_NUM_THREADS if set, else the CPUs this
 * process may run on (affinity mask, cgroup quota; read once per process,
 * again after fork). */
int bx_default_threads(void);

/* The CPUs this process may run on (affinity and quota, as above), >= 1. */
int bx_available_cpus(void);

#ifdef __cplusplus
}
#endif

#endif /* BX_POOL_H */
