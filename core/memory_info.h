// How much memory the machine can give a new run: /proc/meminfo's MemAvailable (free memory plus
// the page cache and reclaimable slabs the kernel can drop), the figure the engine's defaults and
// the memory plan (engine/memory_plan.h) are sized against.
#pragma once

#include <cstdint>
#include <string_view>

namespace moeserve {

// MemAvailable in bytes from the text of /proc/meminfo; 0 when the line is absent or malformed.
int64_t ParseMemAvailable(std::string_view meminfo);
// MemAvailable of this machine in bytes; 0 when unknown (no /proc/meminfo).
int64_t AvailableMemoryBytes();

}  // namespace moeserve
