#include "io/safetensors.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace moeserve::io {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The byte at `pos` of tensor `index`: distinct per tensor, so a mix-up of ranges shows.
std::byte PatternByte(size_t index, size_t pos) {
  return static_cast<std::byte>((index * 31 + pos * 7 + 1) & 0xff);
}

void FillPattern(size_t index, std::span<std::byte> out) {
  for (size_t i = 0; i < out.size(); ++i) out[i] = PatternByte(index, i);
}

bool HasPattern(size_t index, std::span<const std::byte> bytes) {
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != PatternByte(index, i)) return false;
  }
  return true;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string LittleEndian64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// A file as the format lays it out: u64 LE header length, header, `data_size` data bytes.
std::string RawFile(const std::string& header, size_t data_size) {
  return LittleEndian64(header.size()) + header + std::string(data_size, '\x5a');
}

// The specs of the round-trip tests: every compute dtype, an empty tensor and a scalar.
std::vector<SafetensorsTensorSpec> MixedSpecs() {
  return {
      {"model.embed.weight", DType::kBF16, {3, 5}},
      {"layers.0.norm", DType::kF16, {4}},
      {"layers.0.attn.q", DType::kF32, {2, 3}},
      {"layers.0.quant", DType::kI8, {7}},
      {"layers.0.index", DType::kI32, {2, 2, 2}},
      {"empty", DType::kF32, {0, 4}},
      {"scalar", DType::kF32, {}},
  };
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "safetensors_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // Asserts that opening `path` fails and that the message names the file and holds every one of
  // `expected`.
  void ExpectOpenFails(const std::string& path, const std::vector<std::string>& expected,
                       StatusCode code = StatusCode::kInvalidArgument) {
    Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok()) << "opened " << path;
    EXPECT_EQ(file.status().code(), code) << file.status().ToString();
    const std::string& message = file.status().message();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    for (const std::string& s : expected) {
      EXPECT_NE(message.find(s), std::string::npos) << "'" << s << "' not in: " << message;
    }
  }

  void ExpectCheckpointFails(const std::string& dir, const std::vector<std::string>& expected,
                             StatusCode code) {
    Result<SafetensorsCheckpoint> checkpoint = SafetensorsCheckpoint::Open(dir);
    ASSERT_FALSE(checkpoint.ok()) << "opened " << dir;
    EXPECT_EQ(checkpoint.status().code(), code) << checkpoint.status().ToString();
    const std::string& message = checkpoint.status().message();
    for (const std::string& s : expected) {
      EXPECT_NE(message.find(s), std::string::npos) << "'" << s << "' not in: " << message;
    }
  }

  // Writes `file_name` in the test folder holding one F32 [2] tensor per name, for checkpoints
  // whose index the test writes by hand.
  void WriteShard(const std::string& file_name, const std::vector<std::string>& names) {
    std::vector<SafetensorsTensorSpec> specs;
    for (const std::string& name : names) specs.push_back({name, DType::kF32, {2}});
    ASSERT_TRUE(WriteSafetensors(Path(file_name), specs, FillPattern).ok());
  }

  std::string dir_;
};

// ---- Round trips ----

TEST_F(SafetensorsTest, RoundTripSingleFileAllDTypes) {
  const std::vector<SafetensorsTensorSpec> specs = MixedSpecs();
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"author", "moeserve"}};
  const std::string path = Path("mixed.safetensors");
  std::vector<size_t> fill_order;
  ASSERT_TRUE(WriteSafetensors(
                  path, specs,
                  [&](size_t index, std::span<std::byte> out) {
                    fill_order.push_back(index);
                    const SafetensorsTensorSpec& spec = specs[index];
                    EXPECT_EQ(out.size(), Numel(spec.shape) * DTypeSize(spec.dtype));
                    FillPattern(index, out);
                  },
                  metadata)
                  .ok());
  EXPECT_EQ(fill_order, (std::vector<size_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  // The header is padded to a multiple of 8 so that the data area starts aligned.
  const std::string raw = ReadFile(path);
  ASSERT_GE(raw.size(), 8u);
  uint64_t header_len = 0;
  std::memcpy(&header_len, raw.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);

  Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const SafetensorsFile& f = **file;
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.metadata(), metadata);
  ASSERT_EQ(f.tensors().size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const SafetensorsTensor& t = f.tensors()[i];  // header order is the written order
    EXPECT_EQ(t.name, specs[i].name);
    EXPECT_EQ(t.dtype, specs[i].dtype);
    EXPECT_EQ(t.shape, specs[i].shape);
    EXPECT_EQ(t.file, path);
    EXPECT_EQ(t.numel(), Numel(specs[i].shape));
    EXPECT_EQ(t.bytes.size(), static_cast<size_t>(t.numel()) * DTypeSize(t.dtype));
    EXPECT_TRUE(HasPattern(i, t.bytes)) << t.name;
    EXPECT_EQ(f.Find(specs[i].name), &t);

    const Tensor view = t.view();
    EXPECT_EQ(view.dtype(), t.dtype);
    EXPECT_EQ(view.rank(), t.shape.size());
    EXPECT_EQ(view.numel(), t.numel());
    EXPECT_TRUE(view.contiguous());
    EXPECT_EQ(view.data(), static_cast<const void*>(t.bytes.data()));
  }
  EXPECT_EQ(f.Find("absent"), nullptr);
  EXPECT_EQ(f.Find(""), nullptr);
  EXPECT_EQ(f.Find("__metadata__"), nullptr);
  EXPECT_EQ(f.Find("empty")->numel(), 0);
  EXPECT_EQ(f.Find("scalar")->numel(), 1);
}

TEST_F(SafetensorsTest, NoMetadataKeyWhenMetadataEmpty) {
  const std::string path = Path("plain.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"a", DType::kF32, {1}}}, FillPattern).ok());
  EXPECT_EQ(ReadFile(path).find("__metadata__"), std::string::npos);
  Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_TRUE((*file)->metadata().empty());
}

TEST_F(SafetensorsTest, EmptyFileWithNoTensors) {
  const std::string path = Path("none.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {}, FillPattern).ok());
  Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_TRUE((*file)->tensors().empty());
}

TEST_F(SafetensorsTest, CheckpointSingleFile) {
  const std::vector<SafetensorsTensorSpec> specs = MixedSpecs();
  ASSERT_TRUE(WriteSafetensorsCheckpoint(dir_, specs, FillPattern, uint64_t{1} << 30).ok());
  EXPECT_TRUE(fs::exists(Path("model.safetensors")));
  EXPECT_FALSE(fs::exists(Path("model.safetensors.index.json")));

  Result<SafetensorsCheckpoint> checkpoint = SafetensorsCheckpoint::Open(dir_);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  EXPECT_EQ(checkpoint->num_files(), 1u);
  uint64_t expected_total = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const SafetensorsTensor* t = checkpoint->Find(specs[i].name);
    ASSERT_NE(t, nullptr) << specs[i].name;
    EXPECT_EQ(t->dtype, specs[i].dtype);
    EXPECT_EQ(t->shape, specs[i].shape);
    EXPECT_TRUE(HasPattern(i, t->bytes)) << t->name;
    expected_total += t->bytes.size();
  }
  EXPECT_EQ(checkpoint->total_bytes(), expected_total);
  EXPECT_EQ(checkpoint->tensors().size(), specs.size());
  EXPECT_EQ(checkpoint->Find("absent"), nullptr);
}

TEST_F(SafetensorsTest, CheckpointSharded) {
  // Six 64-byte tensors, an empty one and a 400-byte one against 150-byte shards: pairs fit, the
  // big tensor takes a shard alone.
  std::vector<SafetensorsTensorSpec> specs;
  for (int i = 0; i < 6; ++i) {
    specs.push_back(
        {fmt::format("layers.{}.w", i), i % 2 ? DType::kBF16 : DType::kF32, {i % 2 ? 32 : 16}});
  }
  specs.insert(specs.begin() + 3, SafetensorsTensorSpec{"empty", DType::kI8, {0}});
  specs.push_back({"big", DType::kI32, {10, 10}});
  specs.push_back({"tail", DType::kI8, {8}});
  ASSERT_TRUE(WriteSafetensorsCheckpoint(dir_, specs, FillPattern, 150).ok());

  const std::string index_path = Path("model.safetensors.index.json");
  ASSERT_TRUE(fs::exists(index_path));
  EXPECT_FALSE(fs::exists(Path("model.safetensors")));
  const json index = json::parse(ReadFile(index_path));
  const json& weight_map = index.at("weight_map");
  EXPECT_EQ(weight_map.size(), specs.size());

  // Greedy in order: [0,1] [2,empty,3] [4,5] [big] [tail].
  const std::vector<std::string> expected_files = {
      "model-00001-of-00005.safetensors", "model-00001-of-00005.safetensors",
      "model-00002-of-00005.safetensors", "model-00002-of-00005.safetensors",
      "model-00002-of-00005.safetensors", "model-00003-of-00005.safetensors",
      "model-00003-of-00005.safetensors", "model-00004-of-00005.safetensors",
      "model-00005-of-00005.safetensors"};
  ASSERT_EQ(specs.size(), expected_files.size());
  uint64_t expected_total = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(weight_map.at(specs[i].name), expected_files[i]) << specs[i].name;
    EXPECT_TRUE(fs::exists(Path(expected_files[i])));
    expected_total += Numel(specs[i].shape) * DTypeSize(specs[i].dtype);
  }
  EXPECT_EQ(index.at("metadata").at("total_size"), expected_total);

  Result<SafetensorsCheckpoint> checkpoint = SafetensorsCheckpoint::Open(dir_);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  EXPECT_EQ(checkpoint->num_files(), 5u);
  EXPECT_EQ(checkpoint->total_bytes(), expected_total);
  for (size_t i = 0; i < specs.size(); ++i) {
    const SafetensorsTensor* t = checkpoint->Find(specs[i].name);
    ASSERT_NE(t, nullptr) << specs[i].name;
    EXPECT_EQ(t->file, Path(expected_files[i]));
    EXPECT_EQ(t->dtype, specs[i].dtype);
    EXPECT_EQ(t->shape, specs[i].shape);
    EXPECT_TRUE(HasPattern(i, t->bytes)) << t->name;
  }
  // Shard by shard in header order, which here is the written order.
  const std::vector<const SafetensorsTensor*> all = checkpoint->tensors();
  ASSERT_EQ(all.size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(all[i]->name, specs[i].name);
}

TEST_F(SafetensorsTest, CheckpointShardsHoldAtMostMaxBytes) {
  std::vector<SafetensorsTensorSpec> specs;
  for (int i = 0; i < 20; ++i) {
    specs.push_back({fmt::format("t{}", i), DType::kF32, {1 + (i * 7) % 13}});
  }
  constexpr uint64_t kMax = 100;
  ASSERT_TRUE(WriteSafetensorsCheckpoint(dir_, specs, FillPattern, kMax).ok());
  Result<SafetensorsCheckpoint> checkpoint = SafetensorsCheckpoint::Open(dir_);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  std::map<std::string, uint64_t> per_file;
  for (const SafetensorsTensor* t : checkpoint->tensors()) per_file[t->file] += t->bytes.size();
  EXPECT_EQ(per_file.size(), checkpoint->num_files());
  for (const auto& [file, bytes] : per_file) EXPECT_LE(bytes, kMax) << file;
  for (size_t i = 0; i < specs.size(); ++i) {
    const SafetensorsTensor* t = checkpoint->Find(specs[i].name);
    ASSERT_NE(t, nullptr);
    EXPECT_TRUE(HasPattern(i, t->bytes));
  }
}

TEST_F(SafetensorsTest, SingleFileRewriteRemovesStaleIndex) {
  const std::vector<SafetensorsTensorSpec> specs = MixedSpecs();
  ASSERT_TRUE(WriteSafetensorsCheckpoint(dir_, specs, FillPattern, 16).ok());
  ASSERT_TRUE(fs::exists(Path("model.safetensors.index.json")));
  ASSERT_TRUE(WriteSafetensorsCheckpoint(dir_, specs, FillPattern, 1 << 20).ok());
  EXPECT_FALSE(fs::exists(Path("model.safetensors.index.json")));
  Result<SafetensorsCheckpoint> checkpoint = SafetensorsCheckpoint::Open(dir_);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  EXPECT_EQ(checkpoint->num_files(), 1u);
}

TEST_F(SafetensorsTest, CheckpointCreatesMissingDirectory) {
  const std::string dir = Path("nested/model");
  ASSERT_TRUE(WriteSafetensorsCheckpoint(dir, MixedSpecs(), FillPattern, 1 << 20).ok());
  Result<SafetensorsCheckpoint> checkpoint = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
}

// Shard entries the index does not map are still reachable: the index is a routing table, the
// shards are the truth.
TEST_F(SafetensorsTest, UnmappedShardTensorIsFound) {
  WriteShard("a.safetensors", {"x", "extra"});
  WriteFile(Path("model.safetensors.index.json"),
            R"({"metadata": {"total_size": 8}, "weight_map": {"x": "a.safetensors"}})");
  Result<SafetensorsCheckpoint> checkpoint = SafetensorsCheckpoint::Open(dir_);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  EXPECT_NE(checkpoint->Find("x"), nullptr);
  EXPECT_NE(checkpoint->Find("extra"), nullptr);
}

// Hugging Face files may leave holes between tensors and list them out of data order.
TEST_F(SafetensorsTest, HolesAndUnsortedOffsetsAreAccepted) {
  const std::string path = Path("holes.safetensors");
  WriteFile(path, RawFile(R"({"b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]},)"
                          R"( "a": {"dtype": "I8", "shape": [3], "data_offsets": [0, 3]},)"
                          R"( "e": {"dtype": "F16", "shape": [0], "data_offsets": [1, 1]},)"
                          R"( "__metadata__": {"k": "v", "n": 3}})",
                          32));
  Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ASSERT_EQ((*file)->tensors().size(), 3u);
  EXPECT_EQ((*file)->tensors()[0].name, "b");  // header order, not name order
  EXPECT_EQ((*file)->tensors()[1].name, "a");
  EXPECT_EQ((*file)->tensors()[2].name, "e");
  // Non-string metadata values are ignored.
  EXPECT_EQ((*file)->metadata(), (std::map<std::string, std::string>{{"k", "v"}}));
}

// Dtypes outside the compute set open and validate; only a view of them is a programming error.
TEST_F(SafetensorsTest, NonComputeDTypesOpenButDoNotView) {
  const std::string path = Path("u8.safetensors");
  ASSERT_TRUE(
      WriteSafetensors(
          path,
          {{"mask", DType::kBool, {3}}, {"ids", DType::kI64, {2}}, {"fp8", DType::kF8E4M3, {5}}},
          FillPattern)
          .ok());
  Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const SafetensorsTensor* ids = (*file)->Find("ids");
  ASSERT_NE(ids, nullptr);
  EXPECT_EQ(ids->dtype, DType::kI64);
  EXPECT_EQ(ids->bytes.size(), 16u);
  EXPECT_TRUE(HasPattern(1, ids->bytes));
  EXPECT_DEATH((void)ids->view(), "i64");
}

// ---- Writer errors ----

TEST_F(SafetensorsTest, WriterRejectsDuplicateNames) {
  const std::string path = Path("dup.safetensors");
  Status s =
      WriteSafetensors(path, {{"a", DType::kF32, {1}}, {"a", DType::kF32, {2}}}, FillPattern);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("duplicate"), std::string::npos) << s.message();
  EXPECT_FALSE(fs::exists(path));
  s = WriteSafetensorsCheckpoint(dir_, {{"a", DType::kF32, {1}}, {"a", DType::kF32, {2}}},
                                 FillPattern, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

TEST_F(SafetensorsTest, WriterRejectsBadShapes) {
  const std::string path = Path("bad.safetensors");
  Status s = WriteSafetensors(path, {{"neg", DType::kF32, {2, -1}}}, FillPattern);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("neg"), std::string::npos) << s.message();
  s = WriteSafetensors(path, {{"huge", DType::kF32, {int64_t{1} << 40, int64_t{1} << 40}}},
                       FillPattern);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("huge"), std::string::npos) << s.message();
  s = WriteSafetensors(path, {{"", DType::kF32, {1}}}, FillPattern);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  s = WriteSafetensors(path, {{"__metadata__", DType::kF32, {1}}}, FillPattern);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  s = WriteSafetensors(path, {{"bad\xff", DType::kF32, {1}}}, FillPattern);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(SafetensorsTest, WriterReportsUnwritablePath) {
  const std::string path = Path("no/such/dir/x.safetensors");
  const Status s = WriteSafetensors(path, {{"a", DType::kF32, {1}}}, FillPattern);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
}

TEST_F(SafetensorsTest, WriterReplacesExistingFileAtomically) {
  const std::string path = Path("x.safetensors");
  WriteFile(path, "old contents");
  ASSERT_TRUE(WriteSafetensors(path, {{"a", DType::kI8, {4}}}, FillPattern).ok());
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_TRUE(HasPattern(0, (*file)->Find("a")->bytes));
}

// ---- Malformed files: byte-level ----

TEST_F(SafetensorsTest, RejectsMissingFile) {
  ExpectOpenFails(Path("absent.safetensors"), {"no such file"}, StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, RejectsDirectory) { ExpectOpenFails(dir_, {"not a regular file"}); }

TEST_F(SafetensorsTest, RejectsEmptyFile) {
  const std::string path = Path("empty.safetensors");
  WriteFile(path, "");
  ExpectOpenFails(path, {"0 bytes", "shorter"});
}

TEST_F(SafetensorsTest, RejectsFileTruncatedTo4Bytes) {
  const std::string path = Path("trunc.safetensors");
  WriteFile(
      path,
      RawFile(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 4).substr(0, 4));
  ExpectOpenFails(path, {"4 bytes", "shorter"});
}

TEST_F(SafetensorsTest, RejectsZeroHeaderLength) {
  const std::string path = Path("zero.safetensors");
  WriteFile(path, LittleEndian64(0) + "{}");
  ExpectOpenFails(path, {"header length is 0"});
}

TEST_F(SafetensorsTest, RejectsHeaderLengthPastEof) {
  const std::string path = Path("past.safetensors");
  const std::string header = R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
  WriteFile(path, LittleEndian64(header.size() + 100) + header);
  ExpectOpenFails(path, {"header length", "past the end of the file"});
}

TEST_F(SafetensorsTest, RejectsHugeHeaderLength) {
  const std::string path = Path("huge.safetensors");
  WriteFile(path, LittleEndian64(uint64_t{1} << 63) + "{}");
  ExpectOpenFails(path, {"header length 9223372036854775808"});
}

TEST_F(SafetensorsTest, RejectsHeaderOverLimitEvenWhenFileIsLarger) {
  const std::string path = Path("large.safetensors");
  const uint64_t claimed = (uint64_t{100} << 20) + 8;
  std::string bytes = LittleEndian64(claimed) + "{}";
  bytes.resize(8 + claimed, ' ');
  WriteFile(path, bytes);
  ExpectOpenFails(path, {"exceeds the limit"});
}

// ---- Malformed files: header contents, table-driven ----

struct MalformedCase {
  const char* label;
  std::string header;
  size_t data_size;
  std::vector<std::string> expected;  // substrings of the message, beside the path
};

void PrintTo(const MalformedCase& c, std::ostream* os) { *os << c.label; }

class MalformedHeaderTest : public SafetensorsTest,
                            public ::testing::WithParamInterface<MalformedCase> {};

TEST_P(MalformedHeaderTest, OpenFailsWithMessage) {
  const MalformedCase& c = GetParam();
  const std::string path = Path(std::string(c.label) + ".safetensors");
  WriteFile(path, RawFile(c.header, c.data_size));
  ExpectOpenFails(path, c.expected);
}

// A valid entry to pad cases that need a second tensor.
constexpr char kOkEntry[] = R"("ok": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";

std::vector<MalformedCase> MalformedCases() {
  const std::string ok = kOkEntry;
  return {
      {"bad_json", R"({"a": {"dtype": "F32", )", 16, {"not valid JSON"}},
      {"trailing_garbage", R"({} xyz)", 0, {"not valid JSON"}},
      {"invalid_utf8", "{\"a\xff\": {}}", 0, {"UTF-8"}},
      {"nul_in_header", std::string("{\"a\"\0: 1}", 9), 0, {"not valid JSON"}},
      {"header_is_array", R"([{"dtype": "F32"}])", 0, {"array", "not a JSON object"}},
      {"header_is_number", "42", 0, {"not a JSON object"}},
      {"unknown_dtype",
       R"({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 1]}})",
       8,
       {"\"w\"", "unknown dtype \"Q4\"", "BF16"}},
      {"dtype_not_string",
       R"({"w": {"dtype": 4, "shape": [2], "data_offsets": [0, 8]}})",
       8,
       {"\"w\"", "\"dtype\" is a JSON number"}},
      {"missing_dtype",
       R"({"w": {"shape": [2], "data_offsets": [0, 8]}})",
       8,
       {"\"w\"", "missing \"dtype\""}},
      {"missing_shape",
       R"({"w": {"dtype": "F32", "data_offsets": [0, 8]}})",
       8,
       {"\"w\"", "missing \"shape\""}},
      {"shape_not_array",
       R"({"w": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}})",
       8,
       {"\"w\"", "\"shape\" is a JSON number"}},
      {"missing_data_offsets",
       R"({"w": {"dtype": "F32", "shape": [2]}})",
       8,
       {"\"w\"", "missing \"data_offsets\""}},
      {"shape_size_mismatch",
       R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
       16,
       {"\"w\"", "hold 8 bytes", "needs 12 bytes"}},
      {"overlap",
       "{" + ok + R"(, "w": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       16,
       {"\"ok\"", "\"w\"", "overlap"}},
      {"overlap_contained",
       "{" + ok + R"(, "w": {"dtype": "I8", "shape": [2], "data_offsets": [2, 4]}})",
       16,
       {"\"ok\"", "\"w\"", "overlap"}},
      {"offsets_past_eof",
       R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
       12,
       {"\"w\"", "past the end of the data area"}},
      {"negative_dim",
       R"({"w": {"dtype": "F32", "shape": [2, -3], "data_offsets": [0, 8]}})",
       8,
       {"\"w\"", "negative"}},
      {"product_overflow",
       R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})",
       0,
       {"\"w\"", "overflows"}},
      {"byte_count_overflow",
       R"({"w": {"dtype": "F32", "shape": [2305843009213693952, 2], "data_offsets": [0, 0]}})",
       0,
       {"\"w\"", "overflows the byte count"}},
      {"empty_but_huge_dims",
       R"({"w": {"dtype": "F32", "shape": [0, 4294967296, 4294967296], "data_offsets": [0, 0]}})",
       0,
       {"\"w\"", "overflows"}},
      {"dim_beyond_int64",
       R"({"w": {"dtype": "F32", "shape": [18446744073709551615], "data_offsets": [0, 0]}})",
       0,
       {"\"w\"", "too large"}},
      {"dim_beyond_uint64",
       R"({"w": {"dtype": "F32", "shape": [99999999999999999999999], "data_offsets": [0, 0]}})",
       0,
       {"\"w\"", "not an integer"}},
      {"float_dim",
       R"({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})",
       8,
       {"\"w\"", "not an integer"}},
      {"string_dim",
       R"({"w": {"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]}})",
       8,
       {"\"w\"", "not an integer"}},
      {"rank_too_high",
       R"({"w": {"dtype": "I8", "shape": [1,1,1,1,1,1,1], "data_offsets": [0, 1]}})",
       8,
       {"\"w\"", "rank 7"}},
      {"three_offsets",
       R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 16]}})",
       16,
       {"\"w\"", "data_offsets"}},
      {"one_offset",
       R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8]}})",
       16,
       {"\"w\"", "data_offsets"}},
      {"negative_offset",
       R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}})",
       16,
       {"\"w\"", "data_offsets"}},
      {"float_offset",
       R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8.0]}})",
       16,
       {"\"w\"", "data_offsets"}},
      {"offsets_not_array",
       R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": "0-8"}})",
       16,
       {"\"w\"", "data_offsets"}},
      {"begin_after_end",
       R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}})",
       16,
       {"\"w\"", "begin 8 is after end 0"}},
      {"entry_not_object",
       "{" + ok + R"(, "w": [1, 2]})",
       8,
       {"\"w\"", "entry is a JSON array, not an object"}},
      {"entry_null", R"({"w": null})", 0, {"\"w\"", "not an object"}},
      {"duplicate_name", "{" + ok + ", " + ok + "}", 8, {"duplicate", "\"ok\""}},
      {"duplicate_metadata",
       R"({"__metadata__": {}, "__metadata__": {}})",
       0,
       {"duplicate", "__metadata__"}},
      {"metadata_not_object",
       "{" + ok + R"(, "__metadata__": "pt"})",
       8,
       {"__metadata__", "not an object"}},
      {"empty_name",
       R"({"": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
       8,
       {"empty name"}},
  };
}

INSTANTIATE_TEST_SUITE_P(Cases, MalformedHeaderTest, ::testing::ValuesIn(MalformedCases()),
                         [](const ::testing::TestParamInfo<MalformedCase>& info) {
                           return std::string(info.param.label);
                         });

// ---- Malformed checkpoints ----

TEST_F(SafetensorsTest, CheckpointRejectsMissingDirectory) {
  const std::string dir = Path("does-not-exist");
  ExpectCheckpointFails(dir, {dir, "no such directory"}, StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, CheckpointRejectsEmptyDirectory) {
  ExpectCheckpointFails(dir_, {dir_, "model.safetensors.index.json", "model.safetensors"},
                        StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, CheckpointRejectsFileAsDirectory) {
  const std::string path = Path("plain-file");
  WriteFile(path, "x");
  ExpectCheckpointFails(path, {path, "not a directory"}, StatusCode::kInvalidArgument);
}

TEST_F(SafetensorsTest, CheckpointRejectsMissingShard) {
  WriteShard("model-00001-of-00002.safetensors", {"a"});
  WriteFile(Path("model.safetensors.index.json"),
            R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                               "b": "model-00002-of-00002.safetensors"}})");
  ExpectCheckpointFails(dir_, {"model-00002-of-00002.safetensors", "no such file"},
                        StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, CheckpointRejectsParentDirectoryInShardName) {
  WriteShard("a.safetensors", {"a"});
  WriteFile(Path("model.safetensors.index.json"), R"({"weight_map": {"a": "../a.safetensors"}})");
  ExpectCheckpointFails(dir_, {"\"a\"", "../a.safetensors", ".."}, StatusCode::kInvalidArgument);
}

TEST_F(SafetensorsTest, CheckpointRejectsSlashInShardName) {
  WriteFile(Path("model.safetensors.index.json"), R"({"weight_map": {"a": "/etc/passwd"}})");
  ExpectCheckpointFails(dir_, {"\"a\"", "/etc/passwd"}, StatusCode::kInvalidArgument);
}

TEST_F(SafetensorsTest, CheckpointRejectsTensorAbsentFromItsShard) {
  WriteShard("a.safetensors", {"a"});
  WriteShard("b.safetensors", {"b"});
  WriteFile(
      Path("model.safetensors.index.json"),
      R"({"weight_map": {"a": "a.safetensors", "b": "a.safetensors", "c": "b.safetensors"}})");
  ExpectCheckpointFails(dir_, {"\"b\"", "a.safetensors", "does not contain"},
                        StatusCode::kInvalidArgument);
}

TEST_F(SafetensorsTest, CheckpointRejectsTensorInTwoShards) {
  WriteShard("a.safetensors", {"a", "shared"});
  WriteShard("b.safetensors", {"b", "shared"});
  WriteFile(Path("model.safetensors.index.json"),
            R"({"weight_map": {"a": "a.safetensors", "b": "b.safetensors",
                               "shared": "a.safetensors"}})");
  ExpectCheckpointFails(dir_, {"\"shared\"", "a.safetensors", "b.safetensors", "both"},
                        StatusCode::kInvalidArgument);
}

TEST_F(SafetensorsTest, CheckpointRejectsDuplicateWeightMapKey) {
  WriteShard("a.safetensors", {"a"});
  WriteShard("b.safetensors", {"b"});
  WriteFile(Path("model.safetensors.index.json"),
            R"({"weight_map": {"a": "a.safetensors", "a": "b.safetensors"}})");
  ExpectCheckpointFails(dir_, {"duplicate", "\"a\""}, StatusCode::kInvalidArgument);
}

TEST_F(SafetensorsTest, CheckpointRejectsMalformedIndex) {
  WriteShard("a.safetensors", {"a"});
  const std::string index = Path("model.safetensors.index.json");
  struct Case {
    std::string text;
    std::string expected;
  };
  const Case cases[] = {
      {R"({"weight_map": {"a": )", "not valid JSON"},
      {R"(["a.safetensors"])", "not an object"},
      {R"({"metadata": {}})", "missing \"weight_map\""},
      {R"({"weight_map": ["a.safetensors"]})", "\"weight_map\" is a JSON array"},
      {R"({"weight_map": {}})", "empty"},
      {R"({"weight_map": {"a": 3}})", "not a file name"},
      {R"({"weight_map": {"a": ""}})", "not a plain file name"},
      {R"({"metadata": 3, "weight_map": {"a": "a.safetensors"}})", "\"metadata\""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    WriteFile(index, c.text);
    ExpectCheckpointFails(dir_, {index, c.expected}, StatusCode::kInvalidArgument);
  }
}

TEST_F(SafetensorsTest, CheckpointReportsMalformedShard) {
  WriteFile(Path("a.safetensors"), RawFile(R"({"w": {"dtype": "Q4"}})", 0));
  WriteFile(Path("model.safetensors.index.json"), R"({"weight_map": {"w": "a.safetensors"}})");
  ExpectCheckpointFails(dir_, {Path("a.safetensors"), "\"w\"", "Q4"}, StatusCode::kInvalidArgument);
}

TEST_F(SafetensorsTest, CheckpointReportsMalformedSingleFile) {
  WriteFile(Path("model.safetensors"), "tiny");
  ExpectCheckpointFails(dir_, {Path("model.safetensors"), "shorter"}, StatusCode::kInvalidArgument);
}

// ---- Robustness: random corruption must give a Status, never a crash or a stray read. ----

// When a corrupted file opens, every tensor must lie inside the file exactly where its header
// says; this re-derives that with an independent parse.
void ExpectTensorsMatchFile(const SafetensorsFile& file, const std::string& raw) {
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(raw[i]);
  const json header = json::parse(raw.substr(8, header_len));
  const size_t data_start = 8 + header_len;
  for (const SafetensorsTensor& t : file.tensors()) {
    const json& offsets = header.at(t.name).at("data_offsets");
    const uint64_t begin = offsets[0].get<uint64_t>();
    const uint64_t end = offsets[1].get<uint64_t>();
    ASSERT_LE(data_start + end, raw.size()) << t.name;
    ASSERT_EQ(t.bytes.size(), end - begin) << t.name;
    EXPECT_EQ(std::memcmp(t.bytes.data(), raw.data() + data_start + begin, t.bytes.size()), 0)
        << t.name;
  }
}

TEST_F(SafetensorsTest, RandomCorruptionNeverCrashes) {
  const std::string valid_path = Path("valid.safetensors");
  ASSERT_TRUE(WriteSafetensors(valid_path, MixedSpecs(), FillPattern, {{"format", "pt"}}).ok());
  const std::string valid = ReadFile(valid_path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, valid.data(), 8);
  const size_t header_end = 8 + header_len;

  std::mt19937 rng(20240611);
  auto uniform = [&](size_t lo, size_t hi) {  // inclusive
    return std::uniform_int_distribution<size_t>(lo, hi)(rng);
  };
  const std::string path = Path("fuzz.safetensors");
  int opened = 0;
  constexpr int kIterations = 3000;
  for (int iter = 0; iter < kIterations; ++iter) {
    std::string bytes = valid;
    const int mutations = static_cast<int>(uniform(1, 4));
    for (int m = 0; m < mutations && !bytes.empty(); ++m) {
      switch (uniform(0, 4)) {
        case 0:  // flip bits anywhere
          bytes[uniform(0, bytes.size() - 1)] ^= static_cast<char>(uniform(1, 255));
          break;
        case 1:  // flip bits in the length or header, where parsing happens
          bytes[uniform(0, std::min(header_end, bytes.size()) - 1)] ^=
              static_cast<char>(1u << uniform(0, 7));
          break;
        case 2: {  // change a digit of the header: shapes and offsets stay well-formed JSON
          if (bytes.size() <= 9) break;
          const size_t pos = uniform(8, std::min(header_end, bytes.size()) - 1);
          const size_t digit = bytes.find_first_of("0123456789", pos);
          if (digit < std::min(header_end, bytes.size())) {
            bytes[digit] = static_cast<char>('0' + uniform(0, 9));
          }
          break;
        }
        case 3:  // truncate
          bytes.resize(uniform(0, bytes.size()));
          break;
        case 4:  // rewrite the header length
          if (bytes.size() >= 8) {
            const std::string len = LittleEndian64(uniform(0, bytes.size() + 16));
            bytes.replace(0, 8, len);
          }
          break;
      }
    }
    WriteFile(path, bytes);
    Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
    if (file.ok()) {
      ++opened;
      ExpectTensorsMatchFile(**file, bytes);
    } else {
      EXPECT_FALSE(file.status().message().empty());
    }
    if (HasFailure()) {
      ADD_FAILURE() << "iteration " << iter;
      break;
    }
  }
  RecordProperty("opened", opened);
  // Some mutations (digits of the data area, metadata text) leave a valid file.
  EXPECT_GT(opened, 0);
  EXPECT_LT(opened, kIterations);
}

}  // namespace
}  // namespace moeserve::io
