// SafetensorsPageAdvisor over a real mapped file: which pages this process still maps after each
// Done, read from /proc/self/pagemap (bit 63: the page is present in the page table).
#include "io/safetensors_pages.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace moeserve::io {
namespace {

namespace fs = std::filesystem;

std::byte PatternByte(size_t index, size_t pos) {
  return static_cast<std::byte>((index * 37 + pos * 11 + 3) & 0xff);
}

// Whether this process maps the page holding `p`.
bool Mapped(const std::byte* p) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0);
  uint64_t entry = 0;
  const off_t at = static_cast<off_t>(reinterpret_cast<uintptr_t>(p) / page * sizeof(entry));
  EXPECT_EQ(::pread(fd, &entry, sizeof(entry), at), static_cast<ssize_t>(sizeof(entry)));
  ::close(fd);
  return (entry >> 63) != 0;
}

// Pages of `bytes` this process maps.
size_t MappedPages(std::span<const std::byte> bytes) {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  size_t n = 0;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(bytes.data()) / page * page;
  for (uintptr_t a = begin; a < reinterpret_cast<uintptr_t>(bytes.data() + bytes.size());
       a += page) {
    n += Mapped(reinterpret_cast<const std::byte*>(a)) ? 1 : 0;
  }
  return n;
}

uint64_t Touch(std::span<const std::byte> bytes) {
  uint64_t sum = 0;
  for (std::byte b : bytes) sum += static_cast<uint8_t>(b);
  return sum;
}

class SafetensorsPagesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "safetensors_pages_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    // Large tensors, and small ones that share pages with each other and with the large ones.
    const std::vector<int64_t> sizes = {3 << 20, 100,     200,  5000, (1 << 20) + 7, 12, 4096,
                                        1,       4 << 20, 8191, 64,   (2 << 20) + 3, 77};
    std::vector<SafetensorsTensorSpec> specs;
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::string name = "t";
      name += std::to_string(i);
      specs.push_back({name, DType::kU8, {sizes[i]}});
    }
    ASSERT_TRUE(WriteSafetensorsCheckpoint(
                    dir_, specs,
                    [](size_t index, std::span<std::byte> out) {
                      for (size_t i = 0; i < out.size(); ++i) out[i] = PatternByte(index, i);
                    },
                    uint64_t{1} << 40)
                    .ok());
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string dir_;
};

TEST_F(SafetensorsPagesTest, DoneReleasesExactlyThePagesNoPendingTensorShares) {
  Result<SafetensorsCheckpoint> checkpoint = SafetensorsCheckpoint::Open(dir_);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  std::vector<const SafetensorsTensor*> tensors = checkpoint->tensors();
  const std::span<const std::byte> mapping = checkpoint->files()[0]->mapping();
  // t4 is never read; t7 (one byte, inside a page of neighbours) is read twice.
  std::vector<const SafetensorsTensor*> reads;
  for (const SafetensorsTensor* t : tensors) {
    if (t->name != "t4") reads.push_back(t);
    if (t->name == "t7") reads.push_back(t);
  }
  SafetensorsPageAdvisor advisor(*checkpoint, reads);
  uint64_t sum = 0;
  for (const SafetensorsTensor* t : reads) sum += Touch(t->bytes);
  EXPECT_GT(MappedPages(mapping), size_t{9 << 20} / 4096);  // t0, t8, t11: 9 MiB

  std::shuffle(reads.begin(), reads.end(), std::mt19937(7));
  std::vector<const SafetensorsTensor*> pending = reads;
  for (const SafetensorsTensor* t : reads) {
    pending.erase(std::find(pending.begin(), pending.end(), t));
    advisor.Done(*t);
    // Every page of a tensor still to be read is still mapped.
    for (const SafetensorsTensor* p : pending) {
      ASSERT_EQ(
          MappedPages(p->bytes),
          (reinterpret_cast<uintptr_t>(p->bytes.data()) % 4096 + p->bytes.size() + 4095) / 4096)
          << p->name << " lost pages when " << t->name << " was done";
    }
    // A finished tensor keeps only the pages it shares with one still to be read.
    if (std::find(pending.begin(), pending.end(), t) == pending.end()) {
      for (size_t i = 0; i < t->bytes.size(); i += 4096) {
        const std::byte* at = t->bytes.data() + i;
        bool shared = false;
        for (const SafetensorsTensor* p : pending) {
          const uintptr_t page = reinterpret_cast<uintptr_t>(at) / 4096;
          shared |=
              reinterpret_cast<uintptr_t>(p->bytes.data()) / 4096 <= page &&
              page <= reinterpret_cast<uintptr_t>(p->bytes.data() + p->bytes.size() - 1) / 4096;
        }
        EXPECT_EQ(Mapped(at), shared) << t->name << " byte " << i;
      }
    }
  }
  EXPECT_EQ(MappedPages(mapping), 0u);  // the header, t4 and the shared pages too

  // The released bytes read back unchanged, from the page cache.
  uint64_t again = 0;
  for (const SafetensorsTensor* t : reads) {
    again += Touch(t->bytes);
    const size_t index = std::stoul(t->name.substr(1));
    for (size_t i = 0; i < t->bytes.size(); i += 997) {
      ASSERT_EQ(t->bytes[i], PatternByte(index, i)) << t->name << " byte " << i;
    }
  }
  EXPECT_EQ(again, sum);
}

TEST_F(SafetensorsPagesTest, RefusesTensorsItWasNotToldAbout) {
  Result<SafetensorsCheckpoint> checkpoint = SafetensorsCheckpoint::Open(dir_);
  ASSERT_TRUE(checkpoint.ok());
  const std::vector<const SafetensorsTensor*> tensors = checkpoint->tensors();
  const std::vector<const SafetensorsTensor*> reads = {tensors[0]};
  SafetensorsPageAdvisor advisor(*checkpoint, reads);
  advisor.Done(*tensors[0]);
  EXPECT_DEATH(advisor.Done(*tensors[0]), "more often than it was listed");
  EXPECT_DEATH(advisor.Done(*tensors[1]), "not listed");
  Result<SafetensorsCheckpoint> other = SafetensorsCheckpoint::Open(dir_);
  ASSERT_TRUE(other.ok());
  const std::vector<const SafetensorsTensor*> foreign = {other->tensors()[0]};
  EXPECT_DEATH(SafetensorsPageAdvisor(*checkpoint, foreign), "not of this checkpoint");
}

}  // namespace
}  // namespace moeserve::io
