// See report.hpp.
#include "report.hpp"

#include <sys/utsname.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

namespace rlbus::bench {

namespace {

std::string first_line(const std::string& path, const std::string& prefix = "") {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) return line;
  return "";
}

std::string run_command(const std::string& cmd) {
  std::unique_ptr<FILE, int (*)(FILE*)> p(::popen(cmd.c_str(), "r"), ::pclose);
  if (!p) return "";
  std::string out;
  std::array<char, 256> buf{};
  while (std::fgets(buf.data(), buf.size(), p.get()) != nullptr) out += buf.data();
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// rlbus / baseline of the medians; nullopt when the baseline has no value (no trials, 0).
std::optional<double> ratio(const std::vector<double>& a, const std::vector<double>& b) {
  const double mb = median(b);
  if (b.empty() || mb <= 0) return std::nullopt;
  return median(a) / mb;
}

std::string number(const std::vector<double>& v, bool rate) {
  if (v.empty()) return "-";
  return rate ? fmt::format("{:.0f}", median(v)) : fmt::format("{:.1f}", median(v));
}

// Two decimals, more for the small ratios against the HTTP baseline (0.0123).
std::string ratio_text(const std::optional<double>& r) {
  if (!r) return "-";
  return *r >= 0.1 ? fmt::format("{:.2f}", *r) : fmt::format("{:.4f}", *r);
}

// {median, trials}, or null for a baseline this row has none of.
nlohmann::json series(const std::vector<double>& v) {
  if (v.empty()) return nullptr;
  return {{"median", median(v)}, {"trials", v}};
}

nlohmann::json ratio_json(const std::optional<double>& r) {
  return r ? nlohmann::json(*r) : nlohmann::json(nullptr);
}

}  // namespace

double median(std::vector<double> v) {
  return quantile(std::move(v), 0.5);
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  if (q == 0.5 && v.size() % 2 == 0) return (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::clamp<std::size_t>(rank, 1, v.size()) - 1];
}

std::string load_average() {
  const auto line = first_line("/proc/loadavg");
  std::stringstream ss(line);
  std::string a, b, c;
  ss >> a >> b >> c;
  return a + " " + b + " " + c;
}

run_facts collect_facts(const std::string& source_dir) {
  run_facts f;
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  std::array<char, 32> date{};
  std::strftime(date.data(), date.size(), "%Y-%m-%dT%H:%M:%SZ", &tm);
  f.date_utc = date.data();
  utsname u{};
  if (::uname(&u) == 0) f.kernel = std::string(u.sysname) + " " + u.release;
  const auto model = first_line("/proc/cpuinfo", "model name");
  if (const auto colon = model.find(':'); colon != std::string::npos)
    f.cpu_model = model.substr(model.find_first_not_of(' ', colon + 1));
  f.nproc = std::thread::hardware_concurrency();
  f.load_before = load_average();
  if (!source_dir.empty()) {
    const auto git = "git -C '" + source_dir + "' ";
    f.git_commit = run_command(git + "rev-parse --short HEAD 2>/dev/null");
    if (!f.git_commit.empty() &&
        !run_command(git + "status --porcelain --untracked-files=no 2>/dev/null").empty())
      f.git_commit += "+dirty";
  }
  return f;
}

std::string format_table(const run_facts& facts, const std::vector<row>& rows) {
  std::string out = fmt::format(
      "rlbus-bench {}  nproc {}  {}  {}  git {}  load {} -> {}\n", facts.date_utc, facts.nproc,
      facts.kernel, facts.pinned.empty() ? "unpinned" : "pinned to CPU " + facts.pinned,
      facts.git_commit.empty() ? "?" : facts.git_commit, facts.load_before, facts.load_after);
  out +=
      "medians over trials; ratios are rlbus / baseline (latency: >1 is slower than the "
      "baseline; throughput: <1 is slower)\n";
  if (std::any_of(rows.begin(), rows.end(), [](const row& r) { return r.scenario == "scale"; }))
    out +=
        "scale: the direct column is a bare libzmq ROUTER answering the same heartbeats from the "
        "same number of DEALERs\n";
  if (std::any_of(rows.begin(), rows.end(), [](const row& r) { return r.scenario == "journal"; }))
    out +=
        "journal: the direct column is the same broker without a journal (with a standby: the "
        "same journal with no standby), in the same rotation; lost counts tasks submitted and "
        "never finished\n";
  if (std::any_of(rows.begin(), rows.end(), [](const row& r) { return r.scenario == "cost"; }))
    out +=
        "cost: instructions of the middle process per message or task step (callgrind); >1 "
        "costs more than the baseline\n";
  const auto line = [](auto... cols) {
    return fmt::format("{:<11}{:<34}{:<10}{:>11}{:>11}{:>11}{:>11}{:>9}{:>9}{:>9}{:>7}\n", cols...);
  };
  out += line("scenario", "variant", "metric", "rlbus", "proxy", "direct", "http", "r/proxy",
              "r/direct", "r/http", "lost");
  out += line("--------", "-------", "------", "-----", "-----", "------", "----", "-------",
              "--------", "------", "----");
  for (const auto& r : rows) {
    const bool rate = r.higher_is_better;
    out += line(r.scenario, r.variant, r.metric, number(r.rlbus, rate), number(r.proxy, rate),
                number(r.direct, rate), number(r.http, rate), ratio_text(ratio(r.rlbus, r.proxy)),
                ratio_text(ratio(r.rlbus, r.direct)), ratio_text(ratio(r.rlbus, r.http)),
                r.lost ? std::to_string(*r.lost) : std::string("-"));
  }
  return out;
}

nlohmann::json to_json(const run_facts& facts, const std::vector<row>& rows) {
  nlohmann::json j;
  j["schema"] = "rlbus-bench/1";
  j["date"] = facts.date_utc;
  j["command"] = facts.command;
  j["git_commit"] = facts.git_commit;
  j["machine"] = {{"nproc", facts.nproc},
                  {"kernel", facts.kernel},
                  {"cpu_model", facts.cpu_model},
                  {"load_before", facts.load_before},
                  {"load_after", facts.load_after}};
  j["pinned"] = facts.pinned.empty() ? nlohmann::json(nullptr) : nlohmann::json(facts.pinned);
  j["settings"] = facts.settings;
  auto& out = j["rows"] = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json o{{"scenario", r.scenario},
                     {"variant", r.variant},
                     {"metric", r.metric},
                     {"higher_is_better", r.higher_is_better},
                     {"params", r.params},
                     {"rlbus", series(r.rlbus)},
                     {"proxy", series(r.proxy)},
                     {"direct", series(r.direct)},
                     {"http", series(r.http)},
                     {"ratio_proxy", ratio_json(ratio(r.rlbus, r.proxy))},
                     {"ratio_direct", ratio_json(ratio(r.rlbus, r.direct))},
                     {"ratio_http", ratio_json(ratio(r.rlbus, r.http))}};
    if (r.lost) o["lost"] = *r.lost;
    if (r.gaps) o["gaps"] = *r.gaps;
    out.push_back(std::move(o));
  }
  return j;
}

void write_json(const std::string& path, const nlohmann::json& j) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p);
  if (!out) throw std::runtime_error("cannot write " + path);
  out << j.dump(2) << "\n";
  if (!out) throw std::runtime_error("cannot write " + path);
}

}  // namespace rlbus::bench
