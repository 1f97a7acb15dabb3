/* simple_mpi.c — the global norm over MPI ranks: every rank owns a shard of
 * one gradient (its own slice of the elements), and every rank gets the
 * same bits as one process holding the whole gradient.
 *
 *   mpirun -np 4 ./simple_mpi      (any rank count gives the same line) */
#include <stdio.h>

#include <bitexact_mpi.h>

#define N 1000

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  /* the model's gradient g[i] = (i % 7 - 3) / 8, split in contiguous shards */
  int lo = (int)((long long)N * rank / size), hi = (int)((long long)N * (rank + 1) / size);
  float shard[N];
  for (int i = lo; i < hi; i++) shard[i - lo] = (float)(i % 7 - 3) / 8.0f;
  int64_t shape[1] = {hi - lo};
  DLTensor t = {.data = shard, .device = {kDLCPU, 0}, .ndim = 1,
                .dtype = {kDLFloat, 32, 1}, .shape = shape};
  bx_group mine = {&t, 1};

  bx_comm comm = bx_comm_mpi(MPI_COMM_WORLD);
  double norm;
  bx_status st = bx_total_norm(&mine, 1, &comm, NULL, &norm, NULL);
  if (st != BX_OK) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, bx_status_str(st), bx_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (rank == 0) printf("norm %a (%.17g) on %d ranks\n", norm, norm, size);
  MPI_Finalize();
  return 0;
}
