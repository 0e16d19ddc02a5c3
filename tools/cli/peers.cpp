#include "peers.hpp"

#include <cstdlib>
#include <stdexcept>

#ifdef MOESIM_WITH_MPI
#include <mpi.h>
#endif

namespace moesim::tools {

namespace {
/// The process count a launcher announces (Open MPI, PMIx, Slurm's PMI), or 1.
int launcher_size() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"})
    if (const char* s = std::getenv(v)) return std::max(1, std::atoi(s));
  return 1;
}
}  // namespace

Peers::Peers() {
  const int announced = launcher_size();
#ifdef MOESIM_WITH_MPI
  if (announced > 1) {
    MPI_Init(nullptr, nullptr);
    initialized_ = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
#else
  if (announced > 1)
    unavailable_ = "this moesim was built without MPI, so the " + std::to_string(announced) +
                   " processes cannot share the search; install an MPI (Debian: libopenmpi-dev) and rebuild "
                   "(tools/build.sh), or run one process";
#endif
}

Peers::~Peers() {
#ifdef MOESIM_WITH_MPI
  if (initialized_) MPI_Finalize();
#endif
}

strategies::SearchPeers Peers::search_peers() const {
  strategies::SearchPeers p;
  p.rank = rank_;
  p.size = size_;
#ifdef MOESIM_WITH_MPI
  if (size_ > 1)
    p.allgather = [n = size_](const std::string& mine) {
      const long long len = static_cast<long long>(mine.size());
      std::vector<long long> lens(static_cast<std::size_t>(n));
      MPI_Allgather(&len, 1, MPI_LONG_LONG, lens.data(), 1, MPI_LONG_LONG, MPI_COMM_WORLD);
      std::vector<int> counts(static_cast<std::size_t>(n)), displs(static_cast<std::size_t>(n));
      long long total = 0;
      for (int i = 0; i < n; ++i) {
        if (lens[i] > 0x7fffffffLL || total > 0x7fffffffLL - lens[i])
          throw std::runtime_error("a search share over 2 GiB cannot be exchanged in one MPI call");
        counts[i] = static_cast<int>(lens[i]);
        displs[i] = static_cast<int>(total);
        total += lens[i];
      }
      std::string all(static_cast<std::size_t>(total), '\0');
      MPI_Allgatherv(mine.data(), static_cast<int>(mine.size()), MPI_BYTE, all.data(), counts.data(), displs.data(),
                     MPI_BYTE, MPI_COMM_WORLD);
      std::vector<std::string> out;
      for (int i = 0; i < n; ++i) out.push_back(all.substr(static_cast<std::size_t>(displs[i]), static_cast<std::size_t>(counts[i])));
      return out;
    };
#endif
  return p;
}

}  // namespace moesim::tools
