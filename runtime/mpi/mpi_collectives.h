// Collectives over MPI (OpenMPI from Debian) on host memory: MPI_COMM_WORLD, one rank per
// process started by mpirun. Its own CMake target (kiln_mpi), linked by the programs that train
// data-parallel: the rest of kiln never links MPI.
#pragma once

#include <memory>

#include "runtime/collectives.h"

namespace kiln::runtime {

// Initializes MPI once per process (MPI_THREAD_FUNNELED: MPI is called from the thread that
// called this one; compute threads never call it) and returns the world's collectives. Not under
// mpirun: a world of one process. MPI is finalized at exit after the last collectives object is
// gone. `argc`/`argv` may be null.
Expected<std::shared_ptr<Collectives>> mpiCollectives(int* argc = nullptr, char*** argv = nullptr);

}  // namespace kiln::runtime
