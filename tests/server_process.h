// A real `moeserve serve` child process for the end-to-end tests: started on a free loopback port,
// ready once GET /health answers 200, stopped with SIGTERM (which must exit 0).
#pragma once

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tests/run_binary.h"
#include "core/test_paths.h"

namespace moeserve::e2e {

// A port nobody listens on now (the kernel's pick; free again once closed).
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// A TCP socket connected to 127.0.0.1:port, or -1.
inline int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

class ServerProcess {
 public:
  // Starts `moeserve serve --port P <args>` with stderr in `log`, through `launcher` when given
  // (e.g. {"mpirun", "-np", "2"}: found on PATH); waits up to 60 s for /health == 200. ok()
  // tells whether it got there.
  ServerProcess(const std::vector<std::string>& args, std::filesystem::path log,
                const std::vector<std::string>& launcher = {})
      : port_(FreePort()), log_(std::move(log)) {
    pid_ = fork();
    if (pid_ == 0) {
      freopen(log_.c_str(), "w", stderr);
      const std::string port = std::to_string(port_);
      std::vector<const char*> argv;
      for (const std::string& a : launcher) argv.push_back(a.c_str());
      for (const char* a : {MOESERVE_BINARY.c_str(), "serve", "--port", port.c_str()}) argv.push_back(a);
      for (const std::string& a : args) argv.push_back(a.c_str());
      argv.push_back(nullptr);
      execvp(argv[0], const_cast<char* const*>(argv.data()));
      _exit(127);
    }
    // 503 while the weights load; refused before the bind.
    httplib::Client c("127.0.0.1", port_);
    for (int i = 0; i < 600 && !ok_; ++i) {
      if (auto r = c.Get("/health"); r && r->status == 200) {
        ok_ = true;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess() { Stop(); }

  // SIGTERM and wait: the exit code (-1 when killed by a signal or already stopped).
  int Stop() {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  // Sends a signal (the process goes on being this object's).
  void Signal(int sig) {
    if (pid_ > 0) kill(pid_, sig);
  }

  // Waits for the process to end by itself: its exit code (-1 as for Stop).
  int Wait() {
    if (pid_ <= 0) return -1;
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  bool ok() const { return ok_; }
  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string log() const { return ReadFile(log_); }

 private:
  int port_;
  std::filesystem::path log_;
  pid_t pid_ = -1;
  bool ok_ = false;
};

}  // namespace moeserve::e2e
