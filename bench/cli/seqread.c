/*
 * seqread.c — the baselines `bitexact norm` and `bitexact hash` are measured
 * against (bench/cli/bench.py): a plain sequential read of a file.
 *
 *   seqread read FILE   read(2) in 128 KiB blocks into one buffer (what cat
 *                       does; the copy out of the page cache is the work)
 *   seqread mmap FILE   map it read-only (MADV_SEQUENTIAL) and add up every
 *                       64-bit word, one thread (the access pattern of the
 *                       tool's mapped reads, with no arithmetic to speak of)
 * Prints "BYTES SECONDS" (the time of the read alone, open to close).
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static volatile uint64_t keep; /* the loops' result goes somewhere */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
  if (argc != 3 || (strcmp(argv[1], "read") != 0 && strcmp(argv[1], "mmap") != 0)) {
    fprintf(stderr, "usage: seqread read|mmap FILE\n");
    return 2;
  }
  double t0 = now();
  int fd = open(argv[2], O_RDONLY);
  if (fd < 0) {
    perror(argv[2]);
    return 2;
  }
  uint64_t total = 0, sink = 0;
  if (argv[1][0] == 'r') {
    size_t cap = (size_t)128 << 10;
    char *buf = malloc(cap);
    ssize_t got;
    if (!buf) return 2;
    while ((got = read(fd, buf, cap)) > 0) {
      total += (uint64_t)got;
      sink += (unsigned char)buf[got - 1];
    }
    free(buf);
    if (got < 0) {
      perror("read");
      return 2;
    }
  } else {
    struct stat sb;
    if (fstat(fd, &sb) != 0) return 2;
    total = (uint64_t)sb.st_size;
    const uint64_t *p = mmap(NULL, (size_t)total, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      perror("mmap");
      return 2;
    }
    madvise((void *)p, (size_t)total, MADV_SEQUENTIAL);
    for (uint64_t i = 0; i < total / 8; i++) sink += p[i];
    munmap((void *)p, (size_t)total);
  }
  close(fd);
  double t = now() - t0;
  printf("%llu %.6f\n", (unsigned long long)total, t);
  keep = sink;
  return 0;
}
