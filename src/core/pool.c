/*
 * pool.c — the persistent worker threads shared by all calls (pool.h).
 *
 * Workers are started lazily and kept (a norm call on a few hundred small
 * tensors must not pay thread creation). One job runs at a time; a caller
 * that finds the pool busy (another thread's call in flight) runs its tasks
 * alone — results never depend on how many workers ran them.
 *
 * Each worker runs each job in the library's floating-point environment
 * (fpenv.h): a worker keeps the MXCSR of the thread that created it, which
 * may be a caller's with DAZ/FTZ set.
 *
 * fork(): the prepare handler takes the pool's locks (a fork waits for a
 * job in flight to end), the parent releases them, the child resets the
 * pool to "no workers" (they do not exist in the child) and forgets the
 * CPU count, so its first multi-threaded call starts its own workers.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fpenv.h"
#include "pool.h"

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
static int cpus_cached;                           /* bx_available_cpus, 0 = not read */

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void fork_prepare(void) {
  pthread_mutex_lock(&job_lock);
  pthread_mutex_lock(&pool_lock);
}

static void fork_parent(void) {
  pthread_mutex_unlock(&pool_lock);
  pthread_mutex_unlock(&job_lock);
}

static void fork_child(void) {
  /* only the forking thread exists here: a fresh pool, no workers */
  pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t c = PTHREAD_COND_INITIALIZER;
  job_lock = m;
  pool_lock = m;
  pool_wake = c;
  pool_done = c;
  pool_started = 0;
  job_active = job_running = 0;
  cpus_cached = 0;
}

static void atfork_init(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }

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
    bx_fpenv env;
    bx_fpenv_enter(&env);
    run_tasks(id);
    bx_fpenv_leave(&env);
    pthread_mutex_lock(&pool_lock);
    if (--job_running == 0) pthread_cond_signal(&pool_done);
  }
  return NULL;
}

/* ceil(quota / period) from cgroup v2's cpu.max ("max 100000" = none) or
 * v1's cfs files; 0 when no quota is set or none can be read. */
static int cgroup_cpus(void) {
  long long quota = -1, period = 0;
  FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");
  if (f) {
    char q[32] = "";
    if (fscanf(f, "%31s %lld", q, &period) == 2 && strcmp(q, "max") != 0) quota = atoll(q);
    fclose(f);
  } else if ((f = fopen("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "r")) != NULL) {
    if (fscanf(f, "%lld", &quota) != 1) quota = -1;
    fclose(f);
    if ((f = fopen("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "r")) != NULL) {
      if (fscanf(f, "%lld", &period) != 1) period = 0;
      fclose(f);
    }
  }
  if (quota <= 0 || period <= 0) return 0;
  long long n = (quota + period - 1) / period;
  return n > BX_MAX_THREADS ? BX_MAX_THREADS : (int)n;
}

int bx_available_cpus(void) {
  pthread_once(&atfork_once, atfork_init);
  int n = cpus_cached;
  if (n > 0) return n;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
  if (n < 1) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
  int quota = cgroup_cpus();
  if (quota > 0 && quota < n) n = quota;
  if (n < 1) n = 1;
  if (n > BX_MAX_THREADS) n = BX_MAX_THREADS;
  cpus_cached = n; /* a benign race: every reader computes the same */
  return n;
}

int bx_default_threads(void) {
  const char *env = getenv("BX_NUM_THREADS");
  long n = env ? strtol(env, NULL, 10) : 0;
  if (n <= 0) n = bx_available_cpus();
  if (n > BX_MAX_THREADS) n = BX_MAX_THREADS;
  return (int)n;
}

int bx_parallel_run(int nthreads, size_t ntasks, bx_task_fn fn, void *ctx) {
  pthread_once(&atfork_once, atfork_init);
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
