// ModelGroup: the model as the engine drives it -- one rank, or rank 0 of a --tp / --ep group
// whose other ranks mirror every call on their own shard (shard.h) and cache.
//
// Rank 0 (the leader) runs the engine. Each call it makes here -- make the cache, reserve, reset
// or copy a state slot, a forward or an MTP forward over a batch -- is a command the other ranks execute
// with it, meeting in the layers' collectives:
//   - `--comm local`: the ranks are threads of this process. The leader publishes a pointer to
//     the command (no copy: the batch arrays are shared memory) and bumps a counter the
//     followers spin on briefly, then sleep on (a futex, so an idle server burns no core); every
//     command ends with a barrier, so the leader's arrays are free again when the call returns.
//   - `--comm mpi`: the ranks are processes (`mpirun -np N`, one machine or many). The leader
//     serializes the command and its batch -- token ids, positions, each sequence's block table
//     up to its last position, state slots, the rows wanted, the MTP head's hidden input -- and
//     broadcasts it; the other processes run Follow() and rebuild it.
// The collectives of the layers go through each rank's communicator, wrapped in the modelled
// link of --comm-sim when set; commands never are (they stand for rank 0's own host work).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "model/cache.h"
#include "model/causal_lm.h"
#include "parallel/communicator.h"
#include "parallel/link_model.h"
#include "parallel/local_communicator.h"

namespace moeserve::model {

enum class CommKind { kLocal, kMpi };

struct ParallelOptions {
  int tp = 1;       // --tp: ranks
  bool ep = false;  // --ep: routed experts split whole across the ranks
  CommKind comm = CommKind::kLocal;
  std::optional<parallel::LinkModel> link;  // --comm-sim
};

class ModelGroup {
 public:
  // Loads this process's ranks: all of them under kLocal (each rank's shard loaded on its own
  // thread; LoadOptions::threads is per rank), this process's one under kMpi (the group is
  // MPI_COMM_WORLD, whose size must be --tp). Fails on every rank if any rank fails.
  static Result<std::unique_ptr<ModelGroup>> Load(const std::string& dir, LoadOptions options,
                                                  const ParallelOptions& parallel);
  // One rank over an already loaded model (not owned).
  explicit ModelGroup(CausalLm& single);
  ~ModelGroup();  // the leader stops the followers
  ModelGroup(const ModelGroup&) = delete;
  ModelGroup& operator=(const ModelGroup&) = delete;

  // True on the process that drives the group (rank 0); other MPI processes call Follow().
  bool leader() const { return rank_ == 0; }
  int rank() const { return rank_; }  // this process's rank: 0 under kLocal
  int size() const { return size_; }
  // This process's model: on the leader rank 0's, whose outputs (hidden, logits, argmax, MTP)
  // every rank holds identically after a call.
  CausalLm& model() { return *ranks_[0].model; }
  const CausalLm& model() const { return *ranks_[0].model; }
  // Every rank's cache shard; this is rank 0's.
  ModelCache& cache() { return *ranks_[0].cache; }
  const ModelCache& cache() const { return *ranks_[0].cache; }
  // Rank 0's modelled link (--comm-sim), null without one.
  const parallel::SimulatedLinkCommunicator* link() const { return ranks_[0].link.get(); }

  // Leader only, mirrored on every rank (see CausalLm and ModelCache for each).
  void CreateCache(const CacheSizes& sizes);
  void Reserve(int64_t max_tokens, int64_t max_logits_rows);
  void ResetSlot(int32_t slot);
  void CopySlot(int32_t from, int32_t to);
  void SetForwardOptions(const ForwardOptions& forward);  // bench latency --ablation
  void ForwardBatch(const TokenBatch& batch, const int32_t* logits_rows, int64_t num_logits,
                    LogitsMode mode);
  void MtpForwardBatch(const TokenBatch& batch, const float* hidden, const int32_t* logits_rows,
                       int64_t num_logits, LogitsMode mode);

  // MPI followers: executes the leader's commands until it stops the group.
  void Follow();

 private:
  enum class Op : int32_t {
    kCreateCache, kReserve, kResetSlot, kCopySlot, kSetForwardOptions, kForward, kMtpForward,
    kStop
  };
  struct Command {
    Op op = Op::kStop;
    // CreateCache: sizes; Reserve: tokens, rows; ResetSlot: slot; CopySlot: from, to;
    // SetForwardOptions: the switches as bits (ForwardBits), mc2_max_tokens
    int64_t a = 0, b = 0, c = 0;
    const TokenBatch* batch = nullptr;
    const float* hidden = nullptr;  // kMtpForward: [num_tokens, H]
    const int32_t* rows = nullptr;
    int64_t num_rows = 0;
    LogitsMode mode = LogitsMode::kFull;
  };
  struct Rank {
    std::unique_ptr<CausalLm> owned;
    CausalLm* model = nullptr;
    std::unique_ptr<ModelCache> cache;
    parallel::Communicator* raw = nullptr;  // commands and the closing barrier
    std::unique_ptr<parallel::SimulatedLinkCommunicator> link;  // the layers' collectives
  };
  // A received batch on an MPI follower: the arrays a TokenBatch points into.
  struct WireBatch {
    std::vector<int32_t> tokens, seq_of, query_start, state_slots, rows, tables, verify;
    std::vector<int64_t> positions;
    std::vector<const int32_t*> table_of, verify_of;
    std::vector<float> hidden;
    TokenBatch batch;
  };

  ModelGroup() = default;
  void Issue(const Command& command);
  static void Execute(Rank& rank, const Command& command);
  void FollowLocal(int rank);
  std::vector<std::byte> Serialize(const Command& command) const;
  Command Deserialize(const std::vector<std::byte>& bytes, WireBatch& wire) const;

  CommKind kind_ = CommKind::kLocal;
  int rank_ = 0, size_ = 1;
  std::vector<Rank> ranks_;  // this process's ranks: all under kLocal, one under kMpi
  std::unique_ptr<parallel::LocalGroup> local_;
  std::unique_ptr<parallel::Communicator> mpi_;
  std::vector<std::thread> followers_;
  // kLocal: the command being executed, published by bumping issued_.
  const Command* command_ = nullptr;
  std::atomic<uint64_t> issued_{0};
};

}  // namespace moeserve::model
