// Catch2's main, compiled once into an object library shared by every test executable.
//
// A fatal signal prints the test case and section that were running and the stack of the thread
// that took it (binary+offset per frame: `addr2line -f -e BINARY OFFSET` names each), then ends
// the process with that signal. Catch2's own handler is off: it reports through std::string and
// iostreams inside the handler, and when several threads of an OpenMP team fault at once (a
// crash seen on an H200, scripts/gpu-check.sh) its output came out interleaved and the process
// died inside it, with no stack. The device machines have no debugger; this is what is left there.
#define CATCH_CONFIG_MAIN
#define CATCH_CONFIG_NO_POSIX_SIGNALS
#include <catch2/catch.hpp>

#include <execinfo.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

namespace {

char testCase[256] = "(none)";
char section[256] = "";

void copyName(char (&to)[256], const std::string& from) {
  std::strncpy(to, from.c_str(), sizeof to - 1);
  to[sizeof to - 1] = '\0';
}

class RunningTest : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    TestEventListenerBase::testCaseStarting(info);
    copyName(testCase, info.name);
    section[0] = '\0';
  }
  void sectionStarting(const Catch::SectionInfo& info) override {
    TestEventListenerBase::sectionStarting(info);
    copyName(section, info.name);
  }
};

void say(const char* s) {
  (void)!write(STDERR_FILENO, s, std::strlen(s));
}

[[maybe_unused]] void onFatalSignal(int sig) {
  static std::atomic<bool> reporting{false};
  if (reporting.exchange(true)) {
    for (;;) pause();  // Another thread reports; the process ends with it.
  }
  say("\nfatal signal ");
  say(sig == SIGSEGV  ? "SIGSEGV"
      : sig == SIGBUS ? "SIGBUS"
      : sig == SIGILL ? "SIGILL"
      : sig == SIGFPE ? "SIGFPE"
                      : "SIGABRT");
  say(" in test case '");
  say(testCase);
  say("', section '");
  say(section);
  say("'; its thread's stack:\n");
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// Not under a sanitizer: ASan and TSan report fatal signals themselves, with symbols.
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
const bool kReportFatalSignals = [] {
  void* warm[1];
  backtrace(warm, 1);  // Loads the unwinder now, not inside the handler.
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) std::signal(sig, onFatalSignal);
  return true;
}();
#endif

}  // namespace

CATCH_REGISTER_LISTENER(RunningTest)
