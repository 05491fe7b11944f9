#include "model/model_group.h"

#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "core/check.h"
#include "core/log.h"
#include "core/trace.h"
#include "parallel/mpi_communicator.h"

namespace moeserve::model {
namespace {

// Spins of a follower waiting for the next command before it sleeps (a step's host work on the
// leader is well below this, so a busy group never sleeps between steps).
constexpr int kSpinsBeforeSleep = 1 << 16;

// Appends PODs and arrays to a byte buffer; Reader takes them back in the same order.
class Writer {
 public:
  template <typename T>
  void Put(const T& value) {
    Append(&value, sizeof(T));
  }
  template <typename T>
  void PutArray(const T* data, int64_t n) {
    Put(n);
    if (n > 0) Append(data, n * sizeof(T));
  }
  std::vector<std::byte>& bytes() { return bytes_; }

 private:
  void Append(const void* p, size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
  }
  std::vector<std::byte> bytes_;
};

class Reader {
 public:
  explicit Reader(const std::vector<std::byte>& bytes) : bytes_(bytes) {}
  template <typename T>
  T Get() {
    T value;
    Take(&value, sizeof(T));
    return value;
  }
  template <typename T>
  void GetArray(std::vector<T>& out) {
    const int64_t n = Get<int64_t>();
    CHECK_GE(n, 0);
    out.resize(n);
    if (n > 0) Take(out.data(), n * sizeof(T));
  }

 private:
  void Take(void* p, size_t n) {
    CHECK_LE(at_ + n, bytes_.size()) << "a truncated command";
    std::memcpy(p, bytes_.data() + at_, n);
    at_ += n;
  }
  const std::vector<std::byte>& bytes_;
  size_t at_ = 0;
};

}  // namespace

Result<std::unique_ptr<ModelGroup>> ModelGroup::Load(const std::string& dir, LoadOptions options,
                                                     const ParallelOptions& parallel) {
  if (parallel.tp < 1) return InvalidArgument("--tp must be at least 1 (got {})", parallel.tp);
  std::unique_ptr<ModelGroup> group(new ModelGroup());
  group->kind_ = parallel.comm;
  group->size_ = parallel.tp;
  auto attach_link = [&](Rank& rank, parallel::Communicator& raw) {
    rank.raw = &raw;
    if (parallel.link.has_value()) {
      rank.link = std::make_unique<parallel::SimulatedLinkCommunicator>(raw, *parallel.link);
    }
  };
  auto options_of = [&](const Rank& rank, int r) {
    LoadOptions o = options;
    o.shard = ShardSpec{r, parallel.tp, parallel.ep};
    o.comm = rank.link != nullptr ? static_cast<parallel::Communicator*>(rank.link.get())
                                  : rank.raw;
    return o;
  };

  if (parallel.comm == CommKind::kMpi) {
    ASSIGN_OR_RETURN(group->mpi_, parallel::CreateMpiCommunicator());
    parallel::Communicator& world = *group->mpi_;
    if (world.size() != parallel.tp) {
      return InvalidArgument("--tp {} but mpirun started {} processes (-np must equal --tp)",
                             parallel.tp, world.size());
    }
    group->rank_ = world.rank();
    group->ranks_.resize(1);
    Rank& rank = group->ranks_[0];
    attach_link(rank, world);
    Result<std::unique_ptr<CausalLm>> lm = CausalLm::Load(dir, options_of(rank, world.rank()));
    // Every rank learns whether all loaded, so none waits in a collective for one that failed.
    float failed = lm.ok() ? 0.0f : 1.0f;
    world.AllReduceSum(&failed, 1);
    if (!lm.ok()) return lm.status();
    if (failed > 0) return Unavailable("another rank failed to load the model (see its log)");
    rank.owned = std::move(*lm);
    rank.model = rank.owned.get();
    return group;
  }

  // Local: every rank's shard loaded on its own thread, then ranks 1.. follow on theirs.
  group->local_ = std::make_unique<parallel::LocalGroup>(parallel.tp);
  group->ranks_.resize(parallel.tp);
  std::vector<Status> status(parallel.tp);
  {
    std::vector<std::thread> loaders;
    for (int r = 0; r < parallel.tp; ++r) {
      Rank& rank = group->ranks_[r];
      attach_link(rank, group->local_->rank(r));
      loaders.emplace_back([&, r] {
        Result<std::unique_ptr<CausalLm>> lm = CausalLm::Load(dir, options_of(group->ranks_[r], r));
        if (!lm.ok()) {
          status[r] = lm.status();
          return;
        }
        group->ranks_[r].owned = std::move(*lm);
        group->ranks_[r].model = group->ranks_[r].owned.get();
      });
    }
    for (std::thread& t : loaders) t.join();
  }
  for (const Status& s : status) RETURN_IF_ERROR(s);
  for (int r = 1; r < parallel.tp; ++r) {
    group->followers_.emplace_back([g = group.get(), r] { g->FollowLocal(r); });
  }
  return group;
}

ModelGroup::ModelGroup(CausalLm& single) {
  ranks_.resize(1);
  ranks_[0].model = &single;
  ranks_[0].raw = &single.comm();
}

ModelGroup::~ModelGroup() {
  // The stop command outlives the followers' last read of it.
  const Command stop{.op = Op::kStop};
  if (leader() && size_ > 1 && (kind_ == CommKind::kMpi || !followers_.empty())) Issue(stop);
  for (std::thread& t : followers_) t.join();
}

void ModelGroup::CreateCache(const CacheSizes& sizes) {
  Issue(Command{.op = Op::kCreateCache,
                .a = sizes.num_blocks,
                .b = sizes.block_size,
                .c = sizes.num_state_slots});
}

void ModelGroup::Reserve(int64_t max_tokens, int64_t max_logits_rows) {
  Issue(Command{.op = Op::kReserve, .a = max_tokens, .b = max_logits_rows});
}

void ModelGroup::ResetSlot(int32_t slot) { Issue(Command{.op = Op::kResetSlot, .a = slot}); }

void ModelGroup::CopySlot(int32_t from, int32_t to) {
  Issue(Command{.op = Op::kCopySlot, .a = from, .b = to});
}

namespace {

// ForwardOptions' switches as the bits of a command's integer, and back.
constexpr int64_t kFusedAllReduceNorm = 1;
constexpr int64_t kSharedExpertOverlap = 2;
constexpr int64_t kMc2 = 4;
constexpr int64_t kFusedGdnStep = 8;
constexpr int64_t kWarmNextWeights = 16;

int64_t PackForwardBits(const ForwardOptions& f) {
  return (f.fused_allreduce_norm ? kFusedAllReduceNorm : 0) |
         (f.shared_expert_overlap ? kSharedExpertOverlap : 0) | (f.mc2 ? kMc2 : 0) |
         (f.fused_gdn_step ? kFusedGdnStep : 0) | (f.warm_next_weights ? kWarmNextWeights : 0);
}

ForwardOptions UnpackForwardOptions(int64_t bits, int64_t mc2_max_tokens) {
  ForwardOptions f;
  f.fused_allreduce_norm = (bits & kFusedAllReduceNorm) != 0;
  f.shared_expert_overlap = (bits & kSharedExpertOverlap) != 0;
  f.mc2 = (bits & kMc2) != 0;
  f.fused_gdn_step = (bits & kFusedGdnStep) != 0;
  f.warm_next_weights = (bits & kWarmNextWeights) != 0;
  f.mc2_max_tokens = mc2_max_tokens;
  return f;
}

}  // namespace

void ModelGroup::SetForwardOptions(const ForwardOptions& forward) {
  Issue(Command{.op = Op::kSetForwardOptions,
                .a = PackForwardBits(forward),
                .b = forward.mc2_max_tokens});
}

void ModelGroup::ForwardBatch(const TokenBatch& batch, const int32_t* logits_rows,
                              int64_t num_logits, LogitsMode mode) {
  Issue(Command{.op = Op::kForward,
                .batch = &batch,
                .rows = logits_rows,
                .num_rows = num_logits,
                .mode = mode});
}

void ModelGroup::MtpForwardBatch(const TokenBatch& batch, const float* hidden,
                                 const int32_t* logits_rows, int64_t num_logits, LogitsMode mode) {
  Issue(Command{.op = Op::kMtpForward,
                .batch = &batch,
                .hidden = hidden,
                .rows = logits_rows,
                .num_rows = num_logits,
                .mode = mode});
}

void ModelGroup::Execute(Rank& rank, const Command& c) {
  switch (c.op) {
    case Op::kCreateCache:
      rank.cache = std::make_unique<ModelCache>(rank.model->shard().local,
                                                CacheSizes{c.a, c.b, c.c});
      break;
    case Op::kReserve: rank.model->Reserve(c.a, c.b); break;
    case Op::kResetSlot: rank.cache->ResetSlot(static_cast<int32_t>(c.a)); break;
    case Op::kCopySlot:
      rank.cache->CopySlot(static_cast<int32_t>(c.a), static_cast<int32_t>(c.b));
      break;
    case Op::kSetForwardOptions:
      rank.model->set_forward_options(UnpackForwardOptions(c.a, c.b));
      break;
    case Op::kForward:
      rank.model->ForwardBatch(*c.batch, *rank.cache, c.rows, c.num_rows, c.mode);
      break;
    case Op::kMtpForward:
      rank.model->MtpForwardBatch(*c.batch, c.hidden, *rank.cache, c.rows, c.num_rows, c.mode);
      break;
    case Op::kStop: break;
  }
}

void ModelGroup::Issue(const Command& command) {
  CHECK(leader()) << "only rank 0 drives the group";
  if (size_ > 1 && kind_ == CommKind::kMpi) {
    std::vector<std::byte> bytes = Serialize(command);
    int64_t size = static_cast<int64_t>(bytes.size());
    ranks_[0].raw->Broadcast(&size, sizeof(size), 0);
    ranks_[0].raw->Broadcast(bytes.data(), bytes.size(), 0);
  } else if (size_ > 1) {
    command_ = &command;
    issued_.fetch_add(1, std::memory_order_release);
    issued_.notify_all();
  }
  Execute(ranks_[0], command);
  // Local followers read the leader's arrays until they are done: meet them before returning.
  // (A stopping follower returns instead.)
  if (size_ > 1 && kind_ == CommKind::kLocal && command.op != Op::kStop) ranks_[0].raw->Barrier();
}

void ModelGroup::FollowLocal(int r) {
  trace::NameThisThread(r, fmt::format("rank {}", r));
  Rank& rank = ranks_[r];
  uint64_t seen = 0;
  for (;;) {
    uint64_t now = issued_.load(std::memory_order_acquire);
    for (int spin = 0; now == seen && spin < kSpinsBeforeSleep; ++spin) {
      now = issued_.load(std::memory_order_acquire);
    }
    while (now == seen) {
      issued_.wait(seen, std::memory_order_acquire);
      now = issued_.load(std::memory_order_acquire);
    }
    CHECK_EQ(now, seen + 1) << "a follower missed a command";
    seen = now;
    const Command& command = *command_;
    if (command.op == Op::kStop) return;
    Execute(rank, command);
    rank.raw->Barrier();
  }
}

void ModelGroup::Follow() {
  CHECK(!leader() && kind_ == CommKind::kMpi) << "Follow() is for MPI ranks other than 0";
  trace::NameThisThread(rank_, fmt::format("rank {}", rank_));
  WireBatch wire;
  std::vector<std::byte> bytes;
  for (;;) {
    int64_t size = 0;
    ranks_[0].raw->Broadcast(&size, sizeof(size), 0);
    bytes.resize(size);
    ranks_[0].raw->Broadcast(bytes.data(), bytes.size(), 0);
    const Command command = Deserialize(bytes, wire);
    if (command.op == Op::kStop) return;
    Execute(ranks_[0], command);
  }
}

std::vector<std::byte> ModelGroup::Serialize(const Command& c) const {
  Writer w;
  w.Put(c.op);
  w.Put(c.a);
  w.Put(c.b);
  w.Put(c.c);
  if (c.batch == nullptr) return std::move(w.bytes());
  const TokenBatch& b = *c.batch;
  const int64_t T = b.num_tokens, S = b.num_seqs;
  w.Put(c.mode);
  w.PutArray(b.tokens, T);
  w.PutArray(b.positions, T);
  w.PutArray(b.seq_of, T);
  w.PutArray(b.query_start, S + 1);
  w.PutArray(b.state_slots, S);
  w.PutArray(c.rows, c.num_rows);
  // Each sequence's block table up to the block of its last position.
  const int64_t block_size = ranks_[0].cache->sizes().block_size;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t last = b.positions[b.seq_begin(s + 1) - 1];
    w.PutArray(b.block_tables[s], last / block_size + 1);
    const int32_t* verify = b.verify_slots_of(s);
    w.PutArray(verify, verify != nullptr ? b.seq_len(s) : 0);
  }
  const int64_t hidden = c.hidden != nullptr ? T * model().config().hidden_size : 0;
  w.PutArray(c.hidden, hidden);
  return std::move(w.bytes());
}

ModelGroup::Command ModelGroup::Deserialize(const std::vector<std::byte>& bytes,
                                            WireBatch& wire) const {
  Reader r(bytes);
  Command c;
  c.op = r.Get<Op>();
  c.a = r.Get<int64_t>();
  c.b = r.Get<int64_t>();
  c.c = r.Get<int64_t>();
  if (c.op != Op::kForward && c.op != Op::kMtpForward) return c;
  c.mode = r.Get<LogitsMode>();
  r.GetArray(wire.tokens);
  r.GetArray(wire.positions);
  r.GetArray(wire.seq_of);
  r.GetArray(wire.query_start);
  r.GetArray(wire.state_slots);
  r.GetArray(wire.rows);
  const int64_t S = static_cast<int64_t>(wire.state_slots.size());
  // Tables and verify slots are read into per-sequence vectors, then pointed at.
  std::vector<std::vector<int32_t>> tables(S), verify(S);
  for (int64_t s = 0; s < S; ++s) {
    r.GetArray(tables[s]);
    r.GetArray(verify[s]);
  }
  wire.tables.clear();
  wire.verify.clear();
  std::vector<int64_t> table_at(S), verify_at(S);
  for (int64_t s = 0; s < S; ++s) {
    table_at[s] = static_cast<int64_t>(wire.tables.size());
    wire.tables.insert(wire.tables.end(), tables[s].begin(), tables[s].end());
    verify_at[s] = verify[s].empty() ? -1 : static_cast<int64_t>(wire.verify.size());
    wire.verify.insert(wire.verify.end(), verify[s].begin(), verify[s].end());
  }
  wire.table_of.resize(S);
  wire.verify_of.resize(S);
  bool any_verify = false;
  for (int64_t s = 0; s < S; ++s) {
    wire.table_of[s] = wire.tables.data() + table_at[s];
    wire.verify_of[s] = verify_at[s] >= 0 ? wire.verify.data() + verify_at[s] : nullptr;
    any_verify = any_verify || verify_at[s] >= 0;
  }
  r.GetArray(wire.hidden);
  wire.batch = TokenBatch{static_cast<int64_t>(wire.tokens.size()),
                          wire.tokens.data(),
                          wire.positions.data(),
                          wire.seq_of.data(),
                          S,
                          wire.query_start.data(),
                          wire.table_of.data(),
                          wire.state_slots.data(),
                          any_verify ? wire.verify_of.data() : nullptr};
  c.batch = &wire.batch;
  c.rows = wire.rows.data();
  c.num_rows = static_cast<int64_t>(wire.rows.size());
  c.hidden = wire.hidden.empty() ? nullptr : wire.hidden.data();
  return c;
}

}  // namespace moeserve::model
