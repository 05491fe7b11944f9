// Whether an HTTP client has hung up while its non-streaming request is still being computed.
// httplib 0.11 gives a handler no socket and finds a closed connection only when it writes, and a
// non-streaming answer is written once, at the end; so the kernel's table of TCP connections is
// asked instead: a connection the client closed (it sent FIN) sits in CLOSE_WAIT on the server
// side until the server closes it (Linux: /proc/net/tcp and /proc/net/tcp6).
#pragma once

#include <string>

namespace moeserve::server {

// True when the server's side of the TCP connection (local_port, remote_addr:remote_port) is in
// CLOSE_WAIT, i.e. the client has closed it. False when it is open, or cannot be found.
bool PeerHungUp(int local_port, const std::string& remote_addr, int remote_port);

// The state field of a /proc/net/tcp{,6} table's line for that connection ("08" for
// CLOSE_WAIT), or "" when no line matches; `table` is the file's text, ipv6 its kind.
std::string TcpStateIn(const std::string& table, bool ipv6, int local_port,
                       const std::string& remote_addr, int remote_port);

}  // namespace moeserve::server
