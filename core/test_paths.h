// Where tests, benchmarks and fuzz targets find the repository's files and the moeserve binary.
// They are this checkout's paths, known when CMake configures; they live in one generated source
// (build/<preset>/test_paths.cc, made by the top CMakeLists.txt) rather than in compile flags, so
// no other object depends on where the repository was cloned and ccache reuses them across clones.
#pragma once

#include <string>

namespace moeserve::test_paths {

const std::string& SourceDir();        // the repository
const std::string& TestdataDir();      // its testdata/ (golden data, the real Qwen3 tokenizer)
const std::string& DefaultModelDir();  // the model `moeserve` runs without --model
const std::string& Binary();           // this build's moeserve binary

}  // namespace moeserve::test_paths

// The names the tests use (std::string values, not literals).
#define MOESERVE_SOURCE_DIR (::moeserve::test_paths::SourceDir())
#define MOESERVE_TESTDATA_DIR (::moeserve::test_paths::TestdataDir())
#define MOESERVE_DEFAULT_MODEL_DIR (::moeserve::test_paths::DefaultModelDir())
#define MOESERVE_BINARY (::moeserve::test_paths::Binary())
