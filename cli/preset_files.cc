#include "cli/preset_files.h"

#include <zlib.h>

#include <cstddef>

namespace moeserve::cli {

// Generated at build time by cmake/EmbedFile.cmake (cli/CMakeLists.txt).
extern const char kQwen3TokenizerJsonGz[];
extern const std::size_t kQwen3TokenizerJsonGz_size;
extern const char kQwen3TokenizerConfigJson[];
extern const std::size_t kQwen3TokenizerConfigJson_size;
extern const char kQwen35ChatTemplate[];
extern const std::size_t kQwen35ChatTemplate_size;

Result<std::string> Qwen3TokenizerJson() {
  z_stream z{};
  // 16 + MAX_WBITS: a gzip stream (header and CRC-32 checked), as `gzip` wrote it.
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return Internal("zlib: inflateInit2 failed");
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(kQwen3TokenizerJsonGz));
  z.avail_in = static_cast<uInt>(kQwen3TokenizerJsonGz_size);
  std::string out;
  int status = Z_OK;
  while (status == Z_OK) {
    const size_t done = out.size();
    out.resize(done + (size_t{4} << 20));
    z.next_out = reinterpret_cast<Bytef*>(out.data() + done);
    z.avail_out = static_cast<uInt>(out.size() - done);
    status = inflate(&z, Z_NO_FLUSH);
    out.resize(out.size() - z.avail_out);
  }
  inflateEnd(&z);
  if (status != Z_STREAM_END) {
    return Internal("the embedded Qwen3 tokenizer.json does not inflate (zlib status {})", status);
  }
  return out;
}

std::string_view Qwen3TokenizerConfigJson() {
  return {kQwen3TokenizerConfigJson, kQwen3TokenizerConfigJson_size};
}

std::string_view Qwen35ChatTemplate() { return {kQwen35ChatTemplate, kQwen35ChatTemplate_size}; }

}  // namespace moeserve::cli
