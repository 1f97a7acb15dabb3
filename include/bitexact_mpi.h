/*
 * bitexact_mpi.h — the MPI adapter: a bx_comm over an MPI communicator.
 * Lives in its own library (libbitexact_mpi) so that libbitexact never
 * needs MPI. Link with -lbitexact_mpi -lbitexact and your MPI.
 */
#ifndef BITEXACT_MPI_H
#define BITEXACT_MPI_H

#include <mpi.h>

#include "bitexact.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A bx_comm whose all-reduce is MPI_Allreduce(MPI_IN_PLACE, ..., MPI_INT64_T,
 * MPI_SUM or MPI_MAX, comm), and whose allreduce_f32 (used by the training
 * token reduction's ordinary mode only) is MPI_Allreduce of MPI_FLOAT with
 * MPI_SUM. The returned struct holds the communicator
 * handle by value (no allocation, nothing to free); comm must stay valid
 * while the bx_comm is used. rank is filled from MPI_Comm_rank (or -1 if
 * that fails). Every rank of comm must make the same bitexact calls in
 * the same order (they are collective).
 *
 * Errors: an MPI call that returns an error becomes BX_ECOMM. MPI's
 * default error handler (MPI_ERRORS_ARE_FATAL) aborts the job before
 * bitexact sees anything; set MPI_ERRORS_RETURN on the communicator
 * (MPI_Comm_set_errhandler) to get BX_ECOMM instead.
 *
 * Thread-safety: calls on one communicator must not run concurrently from
 * several threads (an MPI rule); MPI must be initialised with at least
 * MPI_THREAD_FUNNELED if other threads use MPI. */
BX_API bx_comm bx_comm_mpi(MPI_Comm comm);

#ifdef __cplusplus
}
#endif
#endif /* BITEXACT_MPI_H */
