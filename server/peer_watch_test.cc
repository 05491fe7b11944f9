// The TCP-table reading behind the non-streaming hang-up check: against table text in the
// kernel's format, and against a real loopback connection whose client closes.
#include "server/peer_watch.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace moeserve::server {
namespace {

constexpr char kTable[] =
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout "
    "inode\n"
    "   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 "
    "1 1 0 100 0 0 10 0\n"
    "   1: 0100007F:1F40 0100007F:D431 08 00000000:00000000 00:00000000 00000000     0        0 "
    "2 1 0 20 4 30 10 -1\n"
    "   2: 0100007F:1F40 0100007F:D432 01 00000000:00000000 00:00000000 00000000     0        0 "
    "3 1 0 20 4 30 10 -1\n";

TEST(PeerWatchTest, FindsTheConnectionsState) {
  // 0x1F40 = 8000, 0xD431 = 54321, 0xD432 = 54322; 0100007F = 127.0.0.1.
  EXPECT_EQ(TcpStateIn(kTable, false, 8000, "127.0.0.1", 54321), "08");  // CLOSE_WAIT
  EXPECT_EQ(TcpStateIn(kTable, false, 8000, "127.0.0.1", 54322), "01");  // ESTABLISHED
  EXPECT_EQ(TcpStateIn(kTable, false, 8000, "127.0.0.1", 1234), "");
  EXPECT_EQ(TcpStateIn(kTable, false, 8000, "10.0.0.1", 54321), "");  // another host
  EXPECT_EQ(TcpStateIn(kTable, true, 8000, "::1", 54321), "08");      // by ports
  EXPECT_EQ(TcpStateIn("garbage\nno fields here\n:::: ::\n", false, 8000, "127.0.0.1", 1), "");
}

TEST(PeerWatchTest, SeesARealClientHangUp) {
  const int server = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(server, 1), 0);
  socklen_t len = sizeof(addr);
  getsockname(server, reinterpret_cast<sockaddr*>(&addr), &len);
  const int local_port = ntohs(addr.sin_port);

  const int client = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  sockaddr_in peer{};
  len = sizeof(peer);
  const int accepted = accept(server, reinterpret_cast<sockaddr*>(&peer), &len);
  ASSERT_GE(accepted, 0);
  const int remote_port = ntohs(peer.sin_port);

  EXPECT_FALSE(PeerHungUp(local_port, "127.0.0.1", remote_port));
  close(client);
  bool seen = false;
  for (int i = 0; i < 100 && !seen; ++i) {
    seen = PeerHungUp(local_port, "127.0.0.1", remote_port);
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(seen);
  close(accepted);
  close(server);
}

}  // namespace
}  // namespace moeserve::server
