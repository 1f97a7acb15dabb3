/*
 * threads.c — a small persistent worker pool shared by all calls.
 *
 * Workers are started lazily and kept (a norm call on a few hundred small
 * tensors must not pay thread creation). One job runs at a time; a caller
 * that finds the pool busy (another thread's call in flight) runs its tasks
 * alone — results never depend on how many workers ran them.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "internal.h"

static pthread_mutex_t job_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t pool_done = PTHREAD_COND_INITIALIZER;
static int pool_started;             /* workers created, ids 1..pool_started */
static unsigned long pool_gen;       /* bumped for each job */
static bx_task_fn job_fn;
static void *job_ctx;
static size_t job_ntasks;
static atomic_size_t job_next;
static int job_active;  /* worker ids < job_active take part */
static int job_running; /* participating workers not finished yet */
static unsigned long start_gen[BX_MAX_THREADS]; /* pool_gen when created */

static void run_tasks(int worker) {
  size_t t;
  while ((t = atomic_fetch_add(&job_next, 1)) < job_ntasks) job_fn(job_ctx, t, worker);
}

static void *worker_main(void *arg) {
  int id = (int)(intptr_t)arg;
  pthread_mutex_lock(&pool_lock);
  unsigned long seen = start_gen[id]; /* a job posted before we ran is ours */
  for (;;) {
    while (pool_gen == seen) pthread_cond_wait(&pool_wake, &pool_lock);
    seen = pool_gen;
    if (id >= job_active) continue;
    pthread_mutex_unlock(&pool_lock);
    run_tasks(id);
    pthread_mutex_lock(&pool_lock);
    if (--job_running == 0) pthread_cond_signal(&pool_done);
  }
  return NULL;
}

int bx_default_threads(void) {
  const char *env = getenv("BX_NUM_THREADS");
  long n = env ? strtol(env, NULL, 10) : 0;
  if (n <= 0) n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1) n = 1;
  if (n > BX_MAX_THREADS) n = BX_MAX_THREADS;
  return (int)n;
}

int bx_parallel_run(int nthreads, size_t ntasks, bx_task_fn fn, void *ctx) {
  if (nthreads > BX_MAX_THREADS) nthreads = BX_MAX_THREADS;
  if ((size_t)nthreads > ntasks) nthreads = (int)ntasks;
  if (nthreads <= 1 || pthread_mutex_trylock(&job_lock) != 0) {
    for (size_t t = 0; t < ntasks; t++) fn(ctx, t, 0);
    return 1;
  }
  pthread_mutex_lock(&pool_lock);
  while (pool_started < nthreads - 1) {
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    start_gen[pool_started + 1] = pool_gen;
    int rc = pthread_create(&th, &attr, worker_main, (void *)(intptr_t)(pool_started + 1));
    pthread_attr_destroy(&attr);
    if (rc != 0) break; /* run with the workers we have */
    pool_started++;
  }
  if (nthreads > pool_started + 1) nthreads = pool_started + 1;
  job_fn = fn;
  job_ctx = ctx;
  job_ntasks = ntasks;
  atomic_store(&job_next, 0);
  job_active = nthreads;
  job_running = nthreads - 1;
  pool_gen++;
  pthread_cond_broadcast(&pool_wake);
  pthread_mutex_unlock(&pool_lock);

  run_tasks(0);

  pthread_mutex_lock(&pool_lock);
  while (job_running > 0) pthread_cond_wait(&pool_done, &pool_lock);
  pthread_mutex_unlock(&pool_lock);
  pthread_mutex_unlock(&job_lock);
  return nthreads;
}
