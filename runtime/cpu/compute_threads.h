// The CPU backend's compute threads: the budget of OpenMP threads that kiln's kernels and oneDNN
// draw from, shared by every run in the process.
#pragma once

namespace kiln::runtime {

// The process's compute threads: kiln's kernels and oneDNN run on OpenMP. This is
// the budget every plan run draws from, whatever the number of threads calling (libgomp gives
// each calling thread a team of its own, so without a budget N callers would run N teams).
// setNumThreads(T) sets it to T (and the calling thread's OpenMP count); call it before runs
// start. The default is OpenMP's (OMP_NUM_THREADS, else all cores).
void setNumThreads(int threads);
int numThreads();

// How the budget is shared: a run that is alone in the process takes up to all of it; while
// other runs are in progress or waiting, each takes one thread. A run waits until its threads
// are free, so at most numThreads() compute threads are busy at any time, and at most one run
// is multi-threaded (a rule made for OpenBLAS, which freed its per-thread buffers when two
// callers asked for different counts; kept: one team at a time also keeps cores from being
// oversubscribed).
//
// Load awareness (on by default; KILN_LOAD_AWARE=0 or setLoadAware(false) turns it off): a run
// alone takes no more threads than the machine has cores that other processes leave free
// (online CPUs minus the other runnable threads, from /proc/loadavg, read at most every 10 ms).
// A team whose threads must wait for cores that other processes hold pays a scheduler time
// slice at every barrier: mnist_cnn at batch 1 took 64 ms on 2 threads against 1.0 ms on one,
// with two busy processes on the two cores (docs/serving.md).
class ComputeThreads {
 public:
  // Blocks until threads are free; returns the number granted (1..wanted).
  static int acquire(int wanted);
  static void release(int threads);
  // The largest number of threads held at once since the process started (tests).
  static int peakInUse();
  static void setLoadAware(bool on);
  static bool loadAware();
  // Cores other processes leave free now (at least 1), as the load-aware grant sees them.
  static int freeCores();
};

// Holds granted compute threads for one run and sets them as the calling thread's OpenMP
// count (a per-thread setting in libgomp), restoring the old count afterwards.
class ThreadGrant {
 public:
  explicit ThreadGrant(int wanted);
  ~ThreadGrant();
  ThreadGrant(const ThreadGrant&) = delete;
  ThreadGrant& operator=(const ThreadGrant&) = delete;
  int threads() const { return granted_; }

 private:
  int previous_;
  int granted_;
};

}  // namespace kiln::runtime
