// Catch2's main, compiled once into an object library shared by every test executable.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <execinfo.h>
#include <unistd.h>

#include <csignal>

namespace {

// A crash prints its stack (binary+offset per frame: `addr2line -f -e BINARY OFFSET` names each)
// after Catch2's report of the test case: Catch2 restores the handlers it found and raises the
// signal again. The device machines, where no debugger is at hand, need that to find a crash.
void printStack(int sig) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  static const char kHead[] = "\nstack at the fatal signal:\n";
  (void)!write(STDERR_FILENO, kHead, sizeof kHead - 1);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

const bool kStackOnCrash = [] {
  void* warm[1];
  backtrace(warm, 1);  // Loads the unwinder now, not inside the handler.
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) std::signal(sig, printStack);
  return true;
}();

}  // namespace
