// What a bench run reports: rows of per-trial values for rlbus and its baselines, printed
// as a fixed-format table and written as JSON (bench/results/latest.json). Medians and
// ratios only; nothing here judges a number.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace rlbus::bench {

/// The median of `v` (0 for an empty vector).
double median(std::vector<double> v);
/// The `q` quantile of `v` by nearest rank (q = 0.99 for p99; 0 for an empty vector).
double quantile(std::vector<double> v, double q);

/// One line of the table: one metric of one rlbus path beside the baselines, each a value
/// per trial.
struct row {
  std::string scenario;  // "latency" or "throughput"
  std::string variant;   // what ran, e.g. "step 64 B, wire"
  std::string metric;    // "median us", "p99 us", "events/s"
  bool higher_is_better = false;
  std::vector<double> rlbus, proxy, direct;
  /// The HTTP request-per-task baseline (DI-engine's shape); empty when it did not run.
  std::vector<double> http;
  /// Throughput: events sent and never received over all trials, and seq jumps seen.
  std::optional<std::uint64_t> lost;
  std::optional<std::uint64_t> gaps;
  nlohmann::json params = nlohmann::json::object();  // payload_bytes, collectors, ...
};

/// Facts about the run that make its numbers comparable (or not) with another run's.
struct run_facts {
  std::string date_utc;
  std::string command;
  std::string kernel;
  std::string cpu_model;
  std::string git_commit;  // "" when unknown; "+dirty" appended for a modified tree
  unsigned nproc = 0;
  std::string pinned;  // "" (unpinned) or the CPU list
  std::string load_before, load_after;
  nlohmann::json settings = nlohmann::json::object();
};

/// Gathers date, kernel, CPU, nproc, load and the git commit of `source_dir`.
run_facts collect_facts(const std::string& source_dir);
std::string load_average();

/// The fixed-format table, one line per row, under a header of the run's facts.
std::string format_table(const run_facts& facts, const std::vector<row>& rows);

/// The machine-readable report (schema "rlbus-bench/1", see bench/README.md).
nlohmann::json to_json(const run_facts& facts, const std::vector<row>& rows);

/// Writes `j` to `path`, creating its folder. Throws std::runtime_error.
void write_json(const std::string& path, const nlohmann::json& j);

}  // namespace rlbus::bench
