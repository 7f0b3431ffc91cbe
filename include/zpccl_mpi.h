/*
 * zpccl over MPI: the host backend's ranks as MPI processes (mpirun), through libzpccl_mpi.so, a small library built
 * beside libzpccl.so when Meson finds MPI (-Dmpi=enabled or auto). It is a client of zpccl.h's transport interface
 * (zpTransport_t, zpCommInitFromTransport) whose callbacks move the bytes with MPI's nonblocking collectives;
 * libzpccl.so itself never needs MPI. Link with -lzpccl_mpi -lzpccl and MPI's flags (mpicc).
 *
 * Timeouts: MPI has none, so each callback polls its operation (MPI_Test) until call->timeoutMs; an operation that
 * does not finish in time is left to MPI (it cannot be cancelled), the callback fails, and the communicator fails on
 * every rank whose MPI still reaches the others. An MPI launcher usually ends the whole job when a process dies. What
 * such an operation was given (its count and displacement arrays, which the transport owns) is kept until MPI
 * completes it; one still pending when its transport is freed is kept for the life of the process, and stderr says
 * so.
 *
 * Errors: zpGetLastError belongs to libzpccl.so. This library's own refusals (a NULL pointer, MPI_COMM_NULL, MPI not
 * initialized, a transport it did not make) and MPI's failures are printed on stderr, "zpccl_mpi: <call> : <why>";
 * zpCommInitFromTransport's, inside zpCommInitFromMpi, are in zpGetLastError(NULL) as usual.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef ZPCCL_MPI_H_
#define ZPCCL_MPI_H_

#include <mpi.h>

#include "zpccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills *transport (ZP_TRANSPORT_INITIALIZER's fields, nranks and rank of mpiComm, the callbacks, a context holding a
 * duplicate of mpiComm, so that zpccl's messages never match the caller's) for zpCommInitFromTransport. Collective
 * over mpiComm (MPI_Comm_dup). The transport's finalize frees the context; when zpCommInitFromTransport fails (or is
 * never called), free it with zpMpiTransportFree. MPI must be initialized (any thread level: the callbacks run on the
 * thread that calls zpccl, one at a time per communicator; with several threads calling MPI at once, initialize with
 * MPI_THREAD_MULTIPLE). */
zpResult_t zpMpiTransportCreate(MPI_Comm mpiComm, zpTransport_t* transport);

/* Frees the context of a transport that zpCommInitFromTransport did not take. */
zpResult_t zpMpiTransportFree(zpTransport_t* transport);

/* zpMpiTransportCreate then zpCommInitFromTransport: a host-backend communicator of mpiComm's ranks, this process
 * being its rank in mpiComm. Collective over mpiComm. config may be NULL (its backend must be unset, default or
 * host). On failure *comm is NULL (when comm is not) and the context is freed; zpGetLastError(NULL) says why when
 * zpCommInitFromTransport failed, stderr when this library refused the call or MPI failed (see Errors above). */
zpResult_t zpCommInitFromMpi(zpComm_t* comm, MPI_Comm mpiComm, zpConfig_t* config);

#ifdef __cplusplus
}
#endif

#endif /* ZPCCL_MPI_H_ */
