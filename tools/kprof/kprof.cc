// kprof: a per-kernel GPU time summary for any CUDA process, for machines without Nsight Systems.
// Loaded by the CUDA driver through its injection hook, it records every kernel (including the
// kernels of CUDA graph replays), memcpy and memset with CUPTI's activity API and, at exit, prints
// per name: launches, total and mean time, plus how busy the GPU was over the recorded window.
//
//   g++ -O2 -shared -fPIC tools/kprof/kprof.cc -I$CUDA/include -L$CUDA/lib -lcupti -o kprof.so
//   CUDA_INJECTION64_PATH=$PWD/kprof.so KPROF_OUT=k.txt blockspec bench ...
//
// Environment: KPROF_OUT (file, default stderr); KPROF_SKIP_S and KPROF_SPAN_S (only activity
// that starts in [init + skip, init + skip + span) counts: a window of a long server run);
// KPROF_WINDOW=signal: only activity that starts between a SIGUSR1 and the next SIGUSR2 to the
// process counts (a window of a server under load, set by the load script); KPROF_TOP (rows
// printed, default 40); KPROF_TRACE (file): also every counted kernel as a line
// "start_ns end_ns name" (ns from the first one, in start order; at most KPROF_TRACE_MAX, default
// 200,000): a timeline, e.g. how long each kernel of a dependent chain adds to the chain (the gaps
// between consecutive end times), which spans of PDL-launched kernels do not show. The process must
// exit normally (SIGTERM to the server, not SIGKILL).
#include <cupti.h>
#include <cxxabi.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace {

struct Totals {
  long count = 0;
  double ns = 0;
};

std::mutex g_mu;
std::map<std::string, Totals> g_by_name;
std::vector<std::pair<uint64_t, uint64_t>> g_intervals;  // kernels only, for the busy time
struct TraceRecord {
  uint64_t start, end;
  std::string name;
};
std::vector<TraceRecord> g_trace;  // KPROF_TRACE only
bool g_tracing = false;
size_t g_trace_max = 200000;
// Records arrive in buffers some time after their kernels ran, so the window is kept as bounds
// on the start timestamps, not as a recording switch.
volatile uint64_t g_from = 0, g_to = UINT64_MAX;
uint64_t g_t0 = 0;
bool g_started = false;

double env_seconds(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atof(v) : 0.0;
}

std::string short_name(const char* mangled) {
  if (!mangled) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  std::free(d);
  // Drop "(anonymous namespace)::" and the argument list, keep template arguments (they tell
  // instances apart), cap the length.
  for (size_t at; (at = s.find("(anonymous namespace)::")) != std::string::npos;) s.erase(at, 23);
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (s[i] == '(' && depth == 0) {
      s.resize(i);
      break;
    }
  }
  if (s.size() > 110) s = s.substr(0, 107) + "...";
  return s;
}

void record(const std::string& name, uint64_t start, uint64_t end, bool kernel) {
  if (start < g_from || start >= g_to) return;
  Totals& t = g_by_name[name];
  ++t.count;
  t.ns += static_cast<double>(end - start);
  if (kernel) g_intervals.emplace_back(start, end);
  if (kernel && g_tracing && g_trace.size() < g_trace_max) g_trace.push_back({start, end, name});
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = 8 << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mu);
  CUpti_Activity* r = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
      record(short_name(k->name), k->start, k->end, true);
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
      const char* dir = m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? "HtoD"
                        : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "DtoH"
                        : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOD ? "DtoD"
                                                                         : "other";
      record(std::string("[memcpy ") + dir + "]", m->start, m->end, false);
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(r);
      record("[memset]", m->start, m->end, false);
    }
  }
  std::free(buffer);
}

void report() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mu);
  const char* path = std::getenv("KPROF_OUT");
  FILE* out = path ? std::fopen(path, "w") : stderr;
  if (!out) out = stderr;
  // Busy time: the union of the kernel intervals; span: first kernel start to last kernel end.
  std::sort(g_intervals.begin(), g_intervals.end());
  double busy = 0, span = 0;
  uint64_t cur_s = 0, cur_e = 0;
  for (const auto& [s, e] : g_intervals) {
    if (s > cur_e) {
      busy += static_cast<double>(cur_e - cur_s);
      cur_s = s;
      cur_e = e;
    } else {
      cur_e = std::max(cur_e, e);
    }
  }
  busy += static_cast<double>(cur_e - cur_s);
  if (!g_intervals.empty()) {
    uint64_t last = 0;
    for (const auto& iv : g_intervals) last = std::max(last, iv.second);
    span = static_cast<double>(last - g_intervals.front().first);
  }
  std::vector<std::pair<std::string, Totals>> rows(g_by_name.begin(), g_by_name.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  double all = 0;
  long launches = 0;
  for (const auto& [n, t] : rows) {
    if (n[0] != '[') {
      all += t.ns;
      launches += t.count;
    }
  }
  std::fprintf(out,
               "kprof: %ld kernels, kernel time %.3f ms, GPU busy %.3f ms of a %.3f ms span "
               "(%.1f %%)\n",
               launches, all / 1e6, busy / 1e6, span / 1e6, span > 0 ? 100.0 * busy / span : 0.0);
  const char* top_env = std::getenv("KPROF_TOP");
  const size_t top = top_env ? static_cast<size_t>(std::atoi(top_env)) : 40;
  std::fprintf(out, "%10s %8s %10s %6s  %s\n", "total_us", "count", "mean_us", "%", "name");
  for (size_t i = 0; i < rows.size() && i < top; ++i) {
    const auto& [n, t] = rows[i];
    std::fprintf(out, "%10.1f %8ld %10.2f %6.1f  %s\n", t.ns / 1e3, t.count, t.ns / 1e3 / t.count,
                 all > 0 && n[0] != '[' ? 100.0 * t.ns / all : 0.0, n.c_str());
  }
  if (out != stderr) std::fclose(out);
  if (const char* trace_path = std::getenv("KPROF_TRACE"); trace_path && !g_trace.empty()) {
    if (FILE* t = std::fopen(trace_path, "w")) {
      std::sort(g_trace.begin(), g_trace.end(),
                [](const TraceRecord& a, const TraceRecord& b) { return a.start < b.start; });
      const uint64_t first = g_trace.front().start;
      for (const TraceRecord& r : g_trace) {
        std::fprintf(t, "%llu %llu %s\n", static_cast<unsigned long long>(r.start - first),
                     static_cast<unsigned long long>(r.end - first), r.name.c_str());
      }
      std::fclose(t);
    }
  }
}

void open_window(int) {
  uint64_t now = 0;
  cuptiGetTimestamp(&now);
  g_to = UINT64_MAX;
  g_from = now;
}
void close_window(int) {
  uint64_t now = 0;
  cuptiGetTimestamp(&now);
  g_to = now;
}

void start() {
  if (g_started) return;
  g_started = true;
  cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
  cuptiGetTimestamp(&g_t0);
  g_tracing = std::getenv("KPROF_TRACE") != nullptr;
  if (const char* m = std::getenv("KPROF_TRACE_MAX")) g_trace_max = std::strtoull(m, nullptr, 10);
  const double skip = env_seconds("KPROF_SKIP_S"), span = env_seconds("KPROF_SPAN_S");
  g_from = g_t0 + static_cast<uint64_t>(skip * 1e9);
  if (span > 0) g_to = g_from + static_cast<uint64_t>(span * 1e9);
  if (const char* w = std::getenv("KPROF_WINDOW"); w && std::strcmp(w, "signal") == 0) {
    g_from = UINT64_MAX;  // nothing counts before the SIGUSR1
    signal(SIGUSR1, open_window);
    signal(SIGUSR2, close_window);
  }
  std::atexit(report);
}

}  // namespace

// The CUDA driver calls this when CUDA_INJECTION64_PATH names this library.
extern "C" int InitializeInjection() {
  start();
  return 1;
}
