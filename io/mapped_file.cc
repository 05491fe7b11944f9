#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

namespace moeserve::io {

std::string ErrnoMessage(int err) { return std::generic_category().message(err); }

Result<FileMapping> MapReadOnly(const std::string& path, uint64_t min_size,
                                std::string_view too_short) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return NotFound("{}: no such file", path);
    return IoError("{}: cannot open: {}", path, ErrnoMessage(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return IoError("{}: cannot stat: {}", path, ErrnoMessage(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument("{}: not a regular file", path);
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < std::max<uint64_t>(min_size, 1)) {
    ::close(fd);
    return InvalidArgument("{}: file is {} bytes, shorter than {}", path, size, too_short);
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int mmap_err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) return IoError("{}: cannot mmap: {}", path, ErrnoMessage(mmap_err));
  return FileMapping{map, size};
}

}  // namespace moeserve::io
