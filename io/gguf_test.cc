#include "io/gguf.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace moeserve::io {
namespace {

namespace fs = std::filesystem;

// A GGUF file built field by field: little-endian, as the format and this host.
class Builder {
 public:
  template <typename T>
  Builder& Put(T v) {
    const auto* p = reinterpret_cast<const char*>(&v);
    bytes_.append(p, sizeof(T));
    return *this;
  }
  Builder& Str(const std::string& s) {
    Put<uint64_t>(s.size());
    bytes_ += s;
    return *this;
  }
  Builder& Header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    bytes_ += "GGUF";
    return Put<uint32_t>(version).Put<uint64_t>(n_tensors).Put<uint64_t>(n_kv);
  }
  Builder& Key(const std::string& key, GgufType type) {
    return Str(key).Put<uint32_t>(static_cast<uint32_t>(type));
  }
  Builder& TensorInfo(const std::string& name, std::vector<uint64_t> ne, uint32_t type,
                      uint64_t offset) {
    Str(name).Put<uint32_t>(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) Put<uint64_t>(d);
    return Put<uint32_t>(type).Put<uint64_t>(offset);
  }
  Builder& AlignTo(size_t alignment) {
    bytes_.resize((bytes_.size() + alignment - 1) / alignment * alignment, '\0');
    return *this;
  }
  Builder& Raw(const std::string& s) {
    bytes_ += s;
    return *this;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

class GgufTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& bytes) {
    const fs::path path = fs::temp_directory_path() / fmt::format("moeserve_gguf_{}", getpid());
    std::ofstream(path, std::ios::binary) << bytes;
    path_ = path.string();
    return path_;
  }
  void TearDown() override {
    std::error_code ec;
    if (!path_.empty()) fs::remove(path_, ec);
  }
  // Open's error for `bytes`, which must be one.
  std::string Error(const std::string& bytes) {
    Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(Write(bytes));
    EXPECT_FALSE(f.ok());
    return f.ok() ? "" : f.status().message();
  }
  std::string path_;
};

// A file with a value of every type, a nested array, an F32 and a Q8_0 tensor.
std::string GoodFile() {
  Builder b;
  b.Header(2, 8);
  b.Key("general.architecture", GgufType::kString).Str("qwen3moe");
  b.Key("u8", GgufType::kUint8).Put<uint8_t>(200);
  b.Key("i32", GgufType::kInt32).Put<int32_t>(-7);
  b.Key("f32", GgufType::kFloat32).Put<float>(0.5f);
  b.Key("u64", GgufType::kUint64).Put<uint64_t>(uint64_t{1} << 40);
  b.Key("flag", GgufType::kBool).Put<uint8_t>(1);
  b.Key("tokens", GgufType::kArray).Put<uint32_t>(8).Put<uint64_t>(2).Str("a").Str("\xff\xfe");
  b.Key("nested", GgufType::kArray).Put<uint32_t>(9).Put<uint64_t>(1);
  b.Put<uint32_t>(5).Put<uint64_t>(2).Put<int32_t>(3).Put<int32_t>(4);
  b.TensorInfo("a.weight", {4, 2}, 0, 0);    // F32 [2, 4]: 32 bytes
  b.TensorInfo("b.weight", {64, 1}, 8, 32);  // Q8_0: 2 blocks of 34 bytes
  b.AlignTo(32);
  std::string data(32 + 68, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i);
  b.Raw(data);
  return b.bytes();
}

TEST_F(GgufTest, ReadsMetadataAndTensors) {
  const std::string bytes = GoodFile();
  Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(Write(bytes));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.alignment(), 32u);
  EXPECT_EQ(g.FindValue("general.architecture")->value, "qwen3moe");
  EXPECT_EQ(g.FindValue("u8")->value, 200);
  EXPECT_EQ(g.FindValue("i32")->value, -7);
  EXPECT_EQ(g.FindValue("f32")->value, 0.5);
  EXPECT_EQ(g.FindValue("u64")->value, uint64_t{1} << 40);
  EXPECT_EQ(g.FindValue("flag")->value, true);
  const GgufValue* tokens = g.FindValue("tokens");
  EXPECT_EQ(tokens->element_type, GgufType::kString);
  EXPECT_EQ(tokens->value, nlohmann::json::array({"a", "\xff\xfe"}));
  EXPECT_EQ(g.FindValue("nested")->value, nlohmann::json::parse("[[3, 4]]"));
  EXPECT_EQ(g.FindValue("absent"), nullptr);

  ASSERT_EQ(g.tensors().size(), 2u);
  const GgufTensor* a = g.Find("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->ne, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(a->numel(), 8);
  EXPECT_EQ(a->bytes.size(), 32u);
  const GgufTensor* q = g.Find("b.weight");
  EXPECT_STREQ(GgmlType(q->type).name, "Q8_0");
  EXPECT_EQ(q->bytes.size(), 68u);
  // The data area starts at the first multiple of 32 after the infos.
  const size_t data_start = bytes.size() - 100;
  EXPECT_EQ(std::memcmp(a->bytes.data(), bytes.data() + data_start, 32), 0);
  EXPECT_EQ(std::memcmp(q->bytes.data(), bytes.data() + data_start + 32, 68), 0);
}

// No metadata, no tensors, no padding after the header: an empty model, not an error.
TEST_F(GgufTest, AnEmptyFileHasNoTensors) {
  Builder b;
  b.Header(0, 0);
  Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(Write(b.bytes()));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_TRUE((*f)->tensors().empty());
  EXPECT_TRUE((*f)->metadata().empty());
}

TEST_F(GgufTest, EveryTruncationIsAnErrorNotACrash) {
  const std::string bytes = GoodFile();
  for (size_t n = 0; n < bytes.size(); ++n) {
    Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(Write(bytes.substr(0, n)));
    EXPECT_FALSE(f.ok()) << n;
  }
}

TEST_F(GgufTest, HostileFieldsAreNamed) {
  EXPECT_NE(Error("GGUX" + std::string(20, '\0')).find("magic"), std::string::npos);
  {
    Builder b;
    b.Header(0, 0, 1);
    EXPECT_NE(Error(b.bytes()).find("version 1"), std::string::npos);
  }
  {  // counts no file could hold
    Builder b;
    b.Header(0, uint64_t{1} << 60);
    EXPECT_NE(Error(b.bytes()).find("metadata count"), std::string::npos);
    Builder t;
    t.Header(uint64_t{1} << 60, 0);
    EXPECT_NE(Error(t.bytes()).find("tensor count"), std::string::npos);
  }
  {  // a string longer than the file
    Builder b;
    b.Header(0, 1).Put<uint64_t>(uint64_t{1} << 62).Raw(std::string(32, 'x'));
    EXPECT_NE(Error(b.bytes()).find("metadata key #0"), std::string::npos);
  }
  {  // an array longer than the file, before anything is allocated
    Builder b;
    b.Header(0, 1).Key("big", GgufType::kArray).Put<uint32_t>(4).Put<uint64_t>(uint64_t{1} << 61);
    EXPECT_NE(Error(b.bytes()).find("'big' claims"), std::string::npos);
  }
  {  // arrays nested too deep
    Builder b;
    b.Header(0, 1).Key("deep", GgufType::kArray).Put<uint32_t>(9).Put<uint64_t>(1);
    b.Put<uint32_t>(9).Put<uint64_t>(1).Put<uint32_t>(4).Put<uint64_t>(0);
    EXPECT_NE(Error(b.bytes()).find("deeper"), std::string::npos);
  }
  {  // unknown value type, a bool that is not 0 or 1, a repeated key
    Builder b;
    b.Header(0, 1).Key("odd", static_cast<GgufType>(77)).Put<uint32_t>(0);
    EXPECT_NE(Error(b.bytes()).find("unknown type 77"), std::string::npos);
    Builder c;
    c.Header(0, 1).Key("flag", GgufType::kBool).Put<uint8_t>(2).Raw(std::string(16, '\0'));
    EXPECT_NE(Error(c.bytes()).find("bool"), std::string::npos);
    Builder d;
    d.Header(0, 2).Key("k", GgufType::kUint8).Put<uint8_t>(1).Key("k", GgufType::kUint8);
    d.Put<uint8_t>(2).Raw(std::string(16, '\0'));
    EXPECT_NE(Error(d.bytes()).find("twice"), std::string::npos);
  }
  {  // alignment not a power of two
    Builder b;
    b.Header(0, 1).Key("general.alignment", GgufType::kUint32).Put<uint32_t>(24);
    b.Raw(std::string(16, '\0'));
    EXPECT_NE(Error(b.bytes()).find("general.alignment"), std::string::npos);
  }
  auto one_tensor = [](std::vector<uint64_t> ne, uint32_t type, uint64_t offset, size_t data) {
    Builder b;
    b.Header(1, 0).TensorInfo("t", std::move(ne), type, offset).AlignTo(32);
    b.Raw(std::string(data, '\0'));
    return b.bytes();
  };
  EXPECT_NE(Error(one_tensor({4}, 0, 0, 8)).find("runs past the end of the data area"),
            std::string::npos);
  EXPECT_NE(Error(one_tensor({4}, 0, 16, 64)).find("not a multiple of the alignment"),
            std::string::npos);
  EXPECT_NE(Error(one_tensor({4}, 0, uint64_t{1} << 63, 64)).find("runs past"), std::string::npos);
  EXPECT_NE(Error(one_tensor({4}, 23, 0, 64)).find("ggml type 23"), std::string::npos);
  EXPECT_NE(Error(one_tensor({48}, 8, 0, 64)).find("not a multiple of its block of 32"),
            std::string::npos);
  EXPECT_NE(Error(one_tensor({0}, 0, 0, 64)).find("dimension 0 = 0"), std::string::npos);
  EXPECT_NE(Error(one_tensor({uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0, 64)).find("2^62"),
            std::string::npos);
  EXPECT_NE(Error(one_tensor({1, 1, 1, 1, 1}, 0, 0, 64)).find("5 dimensions"), std::string::npos);
}

// Every weight type's dtype agrees with ggml's table on block size and bytes, both ways.
TEST(GgmlTypesTest, WeightTypesMatchTheirDTypes) {
  int known = 0;
  for (uint32_t type = 0; type < 40; ++type) {
    const std::optional<DType> d = DTypeOfGgmlType(type);
    if (!d) continue;
    ++known;
    const GgmlTypeTraits traits = GgmlType(type);
    EXPECT_EQ(GgmlBlockWeights(*d), traits.block_size) << traits.name;
    EXPECT_EQ(static_cast<int64_t>(StoredRowBytes(*d, traits.block_size)), traits.block_bytes)
        << traits.name;
    EXPECT_EQ(GgmlTypeOfDType(*d), type) << traits.name;
  }
  EXPECT_EQ(known, 11);
  EXPECT_FALSE(DTypeOfGgmlType(15).has_value());  // Q8_K: llama.cpp's activations only
}

}  // namespace
}  // namespace moeserve::io
