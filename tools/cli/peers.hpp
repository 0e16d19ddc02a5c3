#pragma once
// The processes a search is shared with: MPI ranks when moesim is built with MPI and started by
// mpirun, else this process alone.
//
//   tools::Peers peers;                    // MPI_Init when under mpirun
//   opt.peers = peers.search_peers();      // rank, size, allgather
//   if (!peers.leader()) /* print nothing */;

#include <string>

#include "moesim/strategies/search/search.hpp"

namespace moesim::tools {

class Peers {
 public:
  Peers();
  ~Peers();
  Peers(const Peers&) = delete;
  Peers& operator=(const Peers&) = delete;
  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }
  [[nodiscard]] bool leader() const { return rank_ == 0; }
  [[nodiscard]] strategies::SearchPeers search_peers() const;
  /// Started by a launcher with more than one process, but built without MPI: the message that
  /// says how to enable it (empty otherwise).
  [[nodiscard]] const std::string& unavailable() const { return unavailable_; }

 private:
  int rank_ = 0, size_ = 1;
  bool initialized_ = false;
  std::string unavailable_;
};

}  // namespace moesim::tools
