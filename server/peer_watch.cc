#include "server/peer_watch.h"

#include <arpa/inet.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace moeserve::server {
namespace {

constexpr char kCloseWait[] = "08";

// The port of a table address "ADDR:PORT" (PORT in hex), or -1.
int PortOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return -1;
  return static_cast<int>(std::strtol(address.c_str() + colon + 1, nullptr, 16));
}

// The table's hex form of an IPv4 address (the 32-bit word as the kernel prints it: host order
// on little-endian machines), or "" when `addr` is not IPv4.
std::string Ipv4Hex(const std::string& addr) {
  in_addr a{};
  if (inet_pton(AF_INET, addr.c_str(), &a) != 1) return "";
  char hex[9];
  std::snprintf(hex, sizeof(hex), "%08X", a.s_addr);
  return hex;
}

std::string ReadTable(const char* path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

std::string TcpStateIn(const std::string& table, bool ipv6, int local_port,
                       const std::string& remote_addr, int remote_port) {
  const std::string remote_hex = ipv6 ? "" : Ipv4Hex(remote_addr);
  std::istringstream lines(table);
  std::string line;
  std::getline(lines, line);  // the header
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    if (!(fields >> slot >> local >> remote >> state)) continue;
    if (PortOf(local) != local_port || PortOf(remote) != remote_port) continue;
    // IPv4 tables name the address too; IPv6 ones are matched by the two ports.
    if (!remote_hex.empty() && remote.compare(0, remote_hex.size(), remote_hex) != 0) continue;
    return state;
  }
  return "";
}

bool PeerHungUp(int local_port, const std::string& remote_addr, int remote_port) {
  if (local_port <= 0 || remote_port <= 0) return false;
  const bool ipv6 = remote_addr.find(':') != std::string::npos;
  const std::string state = TcpStateIn(ReadTable(ipv6 ? "/proc/net/tcp6" : "/proc/net/tcp"), ipv6,
                                       local_port, remote_addr, remote_port);
  return state == kCloseWait;
}

}  // namespace moeserve::server
