// Replays fuzz inputs through the decoder's fuzz target (decode_fuzz.cpp) in an ordinary build,
// with no libFuzzer: every file named, or found in a directory named, is decoded once. A crash,
// a sanitizer report (in the sanitizer builds) or an allocation past the bound below fails the
// run. The suite replays the seeds made from the golden vectors and tests/fuzz/corpus/ (what
// fuzz runs found, kept); a libFuzzer build explores further (docs/testing.md).
//   rlbus-fuzz-replay DIR_OR_FILE...
#include <sys/resource.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

// The decoder's limits keep a message's allocations to a few MiB; an input that makes it ask
// for more is a bug, found here as it would be by libFuzzer's -malloc_limit_mb.
#define RLBUS_ALLOCATION_BOUND_MB 1024
#define RLBUS_STR(x) RLBUS_STR_(x)
#define RLBUS_STR_(x) #x
constexpr std::size_t allocation_bound_mb = RLBUS_ALLOCATION_BOUND_MB;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define RLBUS_REPLAY_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define RLBUS_REPLAY_SANITIZED 1
#endif
#endif

#ifdef RLBUS_REPLAY_SANITIZED
// The sanitizers reserve terabytes of address space, so the bound is theirs to keep.
extern "C" const char* __asan_default_options() {
  return "max_allocation_size_mb=" RLBUS_STR(RLBUS_ALLOCATION_BOUND_MB);
}
extern "C" const char* __tsan_default_options() {
  return "max_allocation_size_mb=" RLBUS_STR(RLBUS_ALLOCATION_BOUND_MB);
}
#endif

namespace {

void bound_memory() {
#ifndef RLBUS_REPLAY_SANITIZED
  // Past the bound, new throws std::bad_alloc, which nothing in the decoder catches.
  const rlim_t bytes = static_cast<rlim_t>(allocation_bound_mb) * 1024 * 1024 * 2;
  const rlimit limit{bytes, bytes};
  if (setrlimit(RLIMIT_AS, &limit) != 0) std::perror("rlbus-fuzz-replay: setrlimit");
#endif
}

bool read_file(const std::filesystem::path& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR_OR_FILE...  (replays each input through the decoder)\n",
                 argv[0]);
    return 2;
  }
  std::vector<std::filesystem::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    std::error_code ec;
    if (std::filesystem::is_directory(arg, ec)) {
      for (const auto& entry : std::filesystem::recursive_directory_iterator(arg))
        if (entry.is_regular_file()) inputs.push_back(entry.path());
    } else if (std::filesystem::is_regular_file(arg, ec)) {
      inputs.push_back(arg);
    } else {
      std::fprintf(stderr, "rlbus-fuzz-replay: %s: no such file or directory\n", argv[i]);
      return 2;
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "rlbus-fuzz-replay: no input found in what was named\n");
    return 2;
  }
  std::sort(inputs.begin(), inputs.end());
  bound_memory();
  std::string data;
  for (const auto& path : inputs) {
    if (!read_file(path, data)) {
      std::fprintf(stderr, "rlbus-fuzz-replay: cannot read %s\n", path.c_str());
      return 2;
    }
    // Named before it runs: the input that crashes is the last one printed.
    std::fprintf(stderr, "%s\n", path.c_str());
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(data.data()), data.size());
  }
  std::printf("replayed %zu inputs through the decoder, none failed\n", inputs.size());
  return 0;
}
