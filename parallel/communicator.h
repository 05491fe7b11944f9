// Communicator: how ranks exchange data. Layers call it wherever tensor or expert parallelism
// reduces or exchanges (after o_proj / out_proj / down_proj, around MoE dispatch and combine,
// lm_head); with one rank every call is a no-op that costs nothing.
#pragma once

#include <cstdint>
#include <memory>

namespace moeserve::parallel {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[0, n) = sum over ranks of each rank's data[0, n).
  virtual void AllReduceSum(float* data, int64_t n) = 0;
  // out[r * n, (r + 1) * n) = rank r's in[0, n); out holds size() * n floats.
  virtual void AllGather(const float* in, int64_t n, float* out) = 0;
  virtual void Barrier() = 0;
};

// One rank: every collective is the identity.
class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void AllReduceSum(float*, int64_t) override {}
  void AllGather(const float* in, int64_t n, float* out) override;
  void Barrier() override {}
};

}  // namespace moeserve::parallel
