// A main for a fuzz target built without libFuzzer: it feeds each input file once to
// LLVMFuzzerTestOneInput, as libFuzzer does when given files, so a sanitized gcc build (the asan
// preset) checks every target over its seed corpus without clang. No mutation: real fuzzing is
// the fuzz preset (docs/fuzzing.md).
//
// Usage: TARGET PATH...  -- each PATH a file or a folder (every regular file under it, in name
// order). Arguments starting with '-' are libFuzzer flags: passed to LLVMFuzzerInitialize if the
// target has one, otherwise ignored. Exits 0 after running every input; 1 if a path cannot be
// read or no input was given at all. A crash or a sanitizer report ends the process, as under
// libFuzzer; the last "replay: PATH" line on stderr names the input.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
// Optional in a target (libFuzzer calls it once, before any input); none of ours defines it today.
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

namespace fs = std::filesystem;

[[noreturn]] void CannotRead(const std::string& path, const std::string& why) {
  std::fprintf(stderr, "replay: cannot read %s: %s\n", path.c_str(), why.c_str());
  std::exit(1);
}

// The files a path names: itself, or every regular file under a folder, sorted by path.
std::vector<std::string> InputsOf(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec) CannotRead(path, ec.message());
  if (fs::is_regular_file(st)) return {path};
  if (!fs::is_directory(st)) CannotRead(path, "neither a regular file nor a folder");
  std::vector<std::string> files;
  fs::recursive_directory_iterator it(path, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (it->is_regular_file(type_ec)) files.push_back(it->path().string());
  }
  if (ec) CannotRead(path, ec.message());
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) CannotRead(path, std::strerror(errno));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) CannotRead(path, "read error");
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] == '-') {
      std::fprintf(stderr, "replay: ignoring the libFuzzer flag %s\n", argv[i]);
      continue;
    }
    std::vector<std::string> files = InputsOf(argv[i]);
    inputs.insert(inputs.end(), files.begin(), files.end());
  }
  if (inputs.empty()) {
    std::fprintf(stderr,
                 "replay: no input (usage: %s FILE_OR_FOLDER..., each folder holding at least "
                 "one file)\n",
                 argc > 0 ? argv[0] : "replay");
    return 1;
  }
  for (const std::string& path : inputs) {
    std::fprintf(stderr, "replay: %s\n", path.c_str());
    const std::vector<uint8_t> bytes = ReadFile(path);
    // A buffer of exactly the input's size, as libFuzzer passes: a read past it is an ASan report.
    std::unique_ptr<uint8_t[]> data(new uint8_t[bytes.size()]);
    std::copy(bytes.begin(), bytes.end(), data.get());
    const int result = LLVMFuzzerTestOneInput(data.get(), bytes.size());
    if (result != 0 && result != -1) {  // libFuzzer allows only these two
      std::fprintf(stderr, "replay: %s: LLVMFuzzerTestOneInput returned %d\n", path.c_str(), result);
      return 1;
    }
  }
  std::printf("replay: ran %zu inputs\n", inputs.size());
  return 0;
}
