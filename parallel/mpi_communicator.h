// Ranks that are processes under Open MPI (`mpirun -np N moeserve ... --comm mpi`, on one machine
// or many with a hostfile): MPI_COMM_WORLD. MPI's own headers stay in mpi_communicator.cc.
//
// Reductions keep the Communicator promise -- ranks added in rank order, the same bits on every
// rank, the same bits as the local communicator -- which MPI_Allreduce does not make: an
// all-reduce is an all-to-all of slices (rank r receives everyone's slice r), a sum in rank
// order, and an all-gather of the reduced slices, the same bytes over the wire as a ring.
#pragma once

#include <memory>

#include "core/status.h"
#include "parallel/communicator.h"

namespace moeserve::parallel {

// True when this build links Open MPI.
bool MpiAvailable();

// Initializes MPI once per process (finalized at exit) and returns the communicator of
// MPI_COMM_WORLD. Unimplemented when the build has no MPI; Unavailable when MPI cannot start.
Result<std::unique_ptr<Communicator>> CreateMpiCommunicator();

}  // namespace moeserve::parallel
