// Scenario 4, cost: the instructions the middle process executes per message, counted by
// valgrind's callgrind. Unlike the CPU time of the throughput scenario this count hardly
// moves with the load of a shared machine, so it can tell a change of a few percent in the
// broker from noise, and callgrind's profile says where the instructions go.
//
// Each middle (the real broker, the zmq_proxy and the echo server) runs under callgrind
// twice per trial and kind of traffic, with N1 and N2 messages (or task steps). Start-up,
// the clients' handshakes and shutdown cost the same in both runs, so
// (Ir(N2) - Ir(N1)) / (N2 - N1) is what one more message costs. Callgrind counts every
// thread of the process (the ZeroMQ I/O thread too) into one total, since
// --separate-threads stays off.
//
// The clients are the bench's, not profiled: one thread drives both ends of a path (the
// sending and the receiving socket), so no bench thread competes with the slowed-down
// middle. What still depends on timing (how many messages the middle finds per wake-up,
// timers) makes runs differ a little; bench/README.md says by how much.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "baselines.hpp"
#include "scenario.hpp"
#include "wire.hpp"

namespace rlbus::bench {

namespace {

using namespace std::chrono_literals;

// Valgrind makes a program ~50x slower, and it shares two CPUs with other work: generous
// bounds, which a healthy run never comes near.
constexpr auto start_timeout = 180s;
constexpr int recv_timeout_ms = 60'000;
constexpr auto exit_timeout = 180s;
constexpr std::uint32_t long_timeout_ms = 86'400'000;
constexpr std::size_t top_in_files = 10;
constexpr std::size_t top_in_json = 5;
constexpr std::size_t top_inclusive = 25;
// The broker keeps the stream's last events for replay. A ring smaller than N1 is full in
// both runs, so the difference includes dropping the oldest event, as in any long run.
constexpr int stream_ring = 2048;  // the least the broker takes with its stream window of 1024

std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `cmd` through the shell; its standard output, or throws when it fails.
std::string output_of(const std::string& cmd) {
  std::unique_ptr<FILE, int (*)(FILE*)> p(::popen(cmd.c_str(), "r"), ::pclose);
  if (!p) throw std::runtime_error("cannot run " + cmd);
  std::string out;
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p.get())) > 0) out.append(buf, n);
  if (::pclose(p.release()) != 0) throw std::runtime_error("failed: " + cmd);
  return out;
}

// The program's total of instructions in a callgrind out file: its "totals:" line (or the
// "summary:" line older versions write instead).
std::uint64_t total_ir(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("no callgrind output at " + path);
  std::string line;
  std::optional<std::uint64_t> summary;
  while (std::getline(in, line)) {
    for (const std::string key : {"totals:", "summary:"}) {
      if (line.rfind(key, 0) != 0) continue;
      std::uint64_t v = 0;
      std::stringstream ss(line.substr(key.size()));
      if (!(ss >> v)) throw std::runtime_error("unreadable '" + line + "' in " + path);
      if (key == "totals:") return v;
      summary = v;
    }
  }
  if (summary) return *summary;
  throw std::runtime_error("no totals in " + path + " (did the process end before writing it?)");
}

// Self instructions by function, from callgrind_annotate's listing of every function
// (lines "  1,234 ( 5.67%)  file:function [object]"), in its order (largest first).
std::vector<std::pair<std::string, std::uint64_t>> self_costs(const std::string& listing) {
  std::vector<std::pair<std::string, std::uint64_t>> out;
  std::stringstream ss(listing);
  std::string line;
  bool in_list = false;
  while (std::getline(ss, line)) {
    if (!in_list) {
      in_list = line.find("file:function") != std::string::npos;
      if (in_list) std::getline(ss, line);  // the dashes under the heading
      continue;
    }
    if (line.find_first_not_of(' ') == std::string::npos) break;  // the list's end
    std::uint64_t ir = 0;
    std::size_t i = line.find_first_not_of(' ');
    for (; i < line.size() && (std::isdigit(static_cast<unsigned char>(line[i])) || line[i] == ',');
         ++i)
      if (line[i] != ',') ir = ir * 10 + static_cast<std::uint64_t>(line[i] - '0');
    const auto close = line.find(")  ", i);
    if (close == std::string::npos) continue;
    out.emplace_back(line.substr(close + 3), ir);
  }
  return out;
}

// What one more message costs each function: (self Ir in the N2 run - in the N1 run) /
// (N2 - N1), largest first. Functions that cost less in the longer run (timer noise) are
// left out.
std::vector<std::pair<std::string, double>> per_message(
    const std::vector<std::pair<std::string, std::uint64_t>>& short_run,
    const std::vector<std::pair<std::string, std::uint64_t>>& long_run, std::uint64_t extra) {
  std::map<std::string, std::uint64_t> before(short_run.begin(), short_run.end());
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [fn, ir] : long_run) {
    const auto b = before.count(fn) ? before[fn] : 0;
    if (ir > b) out.emplace_back(fn, static_cast<double>(ir - b) / static_cast<double>(extra));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

// callgrind_annotate names a function "file:function [object]". Split, for the report: the
// object's file name only, the source file (often a long relative path) apart.
struct function_name {
  std::string file, function, object;
};
function_name split_name(const std::string& name) {
  function_name f;
  auto rest = name;
  if (const auto colon = rest.find(':'); colon != std::string::npos) {
    f.file = rest.substr(0, colon);
    rest = rest.substr(colon + 1);
  }
  if (const auto open = rest.rfind(" ["); open != std::string::npos && rest.back() == ']') {
    f.object = std::filesystem::path(rest.substr(open + 2, rest.size() - open - 3)).filename();
    rest = rest.substr(0, open);
  }
  f.function = rest;
  return f;
}
std::string short_name(const std::string& name) {
  const auto f = split_name(name);
  return f.object.empty() ? f.function : f.function + "  [" + f.object + "]";
}

// A program with the same name on $PATH, or "".
std::string on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path != nullptr ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    const auto candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// One middle process under callgrind, with its profile's path.
struct profiled {
  std::unique_ptr<child_process> proc;
  std::string out_file;
  std::string line;  // its start-up line (the endpoints)
};

enum class middle { broker, proxy, echo };
enum class traffic { data, step };

const char* name_of(middle m) {
  return m == middle::broker ? "rlbus" : m == middle::proxy ? "proxy" : "echo";
}
const char* name_of(traffic t) {
  return t == traffic::data ? "data" : "step";
}

class cost_run {
 public:
  cost_run(const settings& s, std::string valgrind, std::string annotate)
      : s_(s), valgrind_(std::move(valgrind)), annotate_(std::move(annotate)) {}

  // Runs `m` under callgrind with `count` messages of `t`; the path of its profile.
  std::string run(middle m, traffic t, std::uint64_t count, int trial) {
    const auto tag = fmt::format("{}-{}-{}-t{}", name_of(m), name_of(t), count, trial);
    auto p = start(m, tag);
    switch (m) {
      case middle::broker:
        t == traffic::data ? broker_data(p, count) : broker_steps(p, count);
        break;
      case middle::proxy:
        proxy(p, t, count);
        break;
      case middle::echo:
        echo(p, t, count);
        break;
    }
    const int status = p.proc->stop(exit_timeout);
    // The broker ends cleanly on SIGTERM (0); the baselines die of it (128 + 15), and
    // valgrind writes their profile on the way out all the same.
    if (status != 0 && status != 128 + SIGTERM)
      throw std::runtime_error(
          fmt::format("{} under valgrind ended with status {}:\n{}", tag, status, p.proc->log()));
    return p.out_file;
  }

  // callgrind_annotate's listing of every function in `file` by self (or inclusive) cost.
  std::string listing(const std::string& file, bool inclusive) const {
    return output_of(shell_quoted(annotate_) +
                     (inclusive ? " --inclusive=yes" : " --inclusive=no") +
                     " --threshold=100 --auto=no 2>/dev/null " + shell_quoted(file));
  }

 private:
  profiled start(middle m, const std::string& tag) {
    profiled p;
    p.out_file = s_.log_dir + "/callgrind." + tag + ".out";
    std::vector<std::string> argv{valgrind_, "--tool=callgrind", "--separate-threads=no",
                                  "--callgrind-out-file=" + p.out_file};
    std::string ready;
    switch (m) {
      case middle::broker:
        // As in the other scenarios, plus: no drain at SIGTERM (the run is over) and a ring
        // smaller than N1 (see stream_ring).
        argv.insert(argv.end(), {s_.broker_bin, "--router", "tcp://127.0.0.1:0", "--events",
                                 "tcp://127.0.0.1:0", "--heartbeat-max", "600000",
                                 "--shutdown-linger", "100", "--drain-ms", "0", "--stream-ring",
                                 std::to_string(stream_ring), "--log-level", "info"});
        ready = "rlbus broker";
        break;
      case middle::proxy:
        argv.insert(argv.end(), {s_.self_bin, "proxy", "--front", "tcp://127.0.0.1:*", "--back",
                                 "tcp://127.0.0.1:*"});
        ready = "rlbus-bench proxy:";
        break;
      case middle::echo:
        argv.insert(argv.end(), {s_.self_bin, "echo", "--bind", "tcp://127.0.0.1:*"});
        ready = "rlbus-bench echo:";
        break;
    }
    p.proc = std::make_unique<child_process>(argv, log_file(s_, "callgrind-" + tag), s_.cpus);
    p.line = p.proc->wait_for_line(ready, start_timeout);
    return p;
  }

  // Sends `count` messages with `send_one` and takes them back with `recv_one`, at most
  // `window` in flight; both on this thread.
  template <class Send, class Recv>
  static void pipeline(std::uint64_t count, std::uint64_t window, Send&& send_one,
                       Recv&& recv_one) {
    std::uint64_t sent = 0;
    for (std::uint64_t got = 0; got < count; ++got) {
      while (sent < count && sent - got < window) {
        send_one();
        ++sent;
      }
      recv_one();
    }
  }

  // The next whole message on `sock` (frames appended to `out` when given). Throws when
  // none comes within recv_timeout_ms.
  static void take(zmq::socket_t& sock, const char* what,
                   std::vector<zmq::message_t>* out = nullptr) {
    bool more = true;
    while (more) {
      zmq::message_t m;
      if (!sock.recv(m, zmq::recv_flags::none))
        throw std::runtime_error(
            fmt::format("no {} within {} s under valgrind", what, recv_timeout_ms / 1000));
      more = m.more();
      if (out != nullptr) out->push_back(std::move(m));
    }
  }

  static void send_frames(zmq::socket_t& sock, const frames& f) {
    sock.send(zmq::buffer(f.header), zmq::send_flags::sndmore);
    sock.send(zmq::buffer(f.body), zmq::send_flags::none);
  }

  // What both broker rows begin with: a coordinator and one worker of `kind` on the broker,
  // the worker's task started (each end with a context of its own, as separate processes).
  struct started_task {
    zmq::context_t coord_ctx{1};
    zmq::context_t worker_ctx{1};
    wire_peer coord;
    wire_peer worker;
    codec::task_start start;

    started_task(const std::string& router, rlbus::role kind)
        : coord(coord_ctx, router), worker(worker_ctx, router) {
      const auto name = std::string(to_string(kind));
      coord.hello(rlbus::role::coordinator, "cost-coord");
      worker.hello(kind, "cost-" + name, {{"wire", 1}});
      codec::submit task;
      // The ids of the committed results (bench/results/cost.json): their lengths count.
      task.task_id = kind == rlbus::role::collector ? "cost-collect" : "cost-learn";
      task.kind = kind;
      task.requirements = {{"wire", 1}};
      task.start_timeout_ms = task.step_timeout_ms = task.close_timeout_ms = task.task_timeout_ms =
          long_timeout_ms;
      coord.send(task);
      if (!coord.expect<codec::submitted>("SUBMITTED", 60s).accepted)
        throw std::runtime_error("the broker refused the cost run's " + name + " task");
      start = worker.expect<codec::task_start>("TASK_START", 60s);
      worker.send(codec::started{start.task_id, start.attempt});
      while (coord.expect<codec::task_event>("the started event", 60s).event != "started") {
      }
    }
  };

  // DATA from one collector -> broker -> TASK_EVENT data to the coordinator (and its copy
  // on the PUB), as in the throughput scenario.
  void broker_data(profiled& p, std::uint64_t count) {
    started_task st(word_after(p.line, "router"), rlbus::role::collector);
    auto& coord = st.coord;
    const auto& start = st.start;
    const std::string payload(s_.data_payload, 'x');
    const auto data = encode(codec::data_ready{start.task_id, start.attempt, "d", "bench",
                                               codec::empty_map_blob, payload});
    auto& in = coord.socket();
    in.set(zmq::sockopt::rcvtimeo, recv_timeout_ms);
    std::uint64_t last_seq = coord.last_seq();
    std::vector<zmq::message_t> msg;
    pipeline(
        count, s_.window, [&] { send_frames(st.worker.socket(), data); },
        [&] {
          // Anything else the broker may send the coordinator (a heartbeat) is passed over.
          while (true) {
            msg.clear();
            take(in, "TASK_EVENT", &msg);
            const auto h =
                msg.size() == 2 ? codec::parse_header(msg[0].to_string_view()) : std::nullopt;
            if (h && h->type == static_cast<std::uint8_t>(codec::msg_type::task_event)) break;
          }
          const auto seq = peek_seq(msg[1].to_string_view());
          if (!seq || *seq != last_seq + 1)
            throw std::runtime_error("the broker's events came out of sequence or malformed");
          last_seq = *seq;
        });
  }

  // A learner's data request through the broker and back, one at a time, as in the
  // latency scenario: GET_DATA -> TASK_EVENT data_request -> DATA_REPLY -> LEARN.
  void broker_steps(profiled& p, std::uint64_t count) {
    started_task st(word_after(p.line, "router"), rlbus::role::learner);
    auto& coord = st.coord;
    auto& learner = st.worker;
    const auto& start = st.start;
    const auto data = bin_blob(s_.data_payload);
    for (std::uint64_t r = 1; r <= count; ++r) {
      learner.send(codec::get_data{start.task_id, start.attempt, r, "bench", 1, r});
      const auto e = coord.expect<codec::task_event>("the data_request event", 60s);
      if (e.event != "data_request")
        throw std::runtime_error("the broker sent a '" + e.event + "' event, not data_request");
      coord.send(codec::data_reply{e.task_id, map_uint(e.body, "request_id").value_or(0), data});
      if (learner.expect<codec::learn>("LEARN", 60s).request_id != r)
        throw std::runtime_error("a LEARN answered another request");
    }
  }

  // DATA frames through the zmq_proxy to one receiving DEALER (pipelined), or a 64 B
  // message there and back through an echoing DEALER (one at a time).
  void proxy(profiled& p, traffic t, std::uint64_t count) {
    zmq::context_t ctx(1);
    auto client = make_socket(ctx, zmq::socket_type::dealer);
    client.connect(word_after(p.line, "front"));
    auto far = make_socket(ctx, zmq::socket_type::dealer);
    far.connect(word_after(p.line, "back"));
    client.set(zmq::sockopt::rcvtimeo, recv_timeout_ms);
    far.set(zmq::sockopt::rcvtimeo, recv_timeout_ms);
    if (t == traffic::data) {
      const auto data = data_frames();
      pipeline(
          count, s_.window, [&] { send_frames(client, data); },
          [&] { take(far, "message through the proxy"); });
      return;
    }
    const auto msg = step_frames();
    std::vector<zmq::message_t> back;
    for (std::uint64_t i = 0; i < count; ++i) {
      send_frames(client, msg);
      back.clear();
      take(far, "message through the proxy", &back);
      for (std::size_t f = 0; f < back.size(); ++f)
        far.send(back[f], f + 1 < back.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
      take(client, "echo through the proxy");
    }
  }

  // The same through the echo server: every message comes back to its sender.
  void echo(profiled& p, traffic t, std::uint64_t count) {
    zmq::context_t ctx(1);
    auto client = make_socket(ctx, zmq::socket_type::dealer);
    client.connect(word_after(p.line, "router"));
    client.set(zmq::sockopt::rcvtimeo, recv_timeout_ms);
    const auto msg = t == traffic::data ? data_frames() : step_frames();
    pipeline(
        count, t == traffic::data ? s_.window : 1, [&] { send_frames(client, msg); },
        [&] { take(client, "echo"); });
  }

  // The encoded DATA the broker gets, for the baselines' data rows.
  frames data_frames() const {
    return encode(codec::data_ready{"cost-collect", 1, "d", "bench", codec::empty_map_blob,
                                    std::string(s_.data_payload, 'x')});
  }
  // The latency scenario's baseline message: a header and the step payload.
  frames step_frames() const {
    const auto h = codec::make_header(codec::msg_type::learn);
    return {std::string(h.data(), h.size()), std::string(s_.data_payload, 'x')};
  }

  const settings& s_;
  std::string valgrind_;
  std::string annotate_;
};

}  // namespace

std::string cost_tools_missing() {
  std::string missing;
  for (const char* tool : {"valgrind", "callgrind_annotate"})
    if (on_path(tool).empty()) missing += std::string(missing.empty() ? "" : " and ") + tool;
  return missing;
}

std::vector<row> run_cost(const settings& s) {
  const auto valgrind = on_path("valgrind");
  const auto annotate = on_path("callgrind_annotate");
  if (valgrind.empty() || annotate.empty())
    throw std::runtime_error("cost needs valgrind and callgrind_annotate on PATH");
  cost_run runner(s, valgrind, annotate);
  const std::vector<middle> middles{middle::broker, middle::proxy, middle::echo};
  std::vector<row> rows;
  for (const auto t : {traffic::data, traffic::step}) {
    const auto n1 = s.cost_base;
    const auto n2 = t == traffic::data ? s.messages : static_cast<std::uint64_t>(s.rounds);
    if (n2 <= n1)
      throw std::runtime_error(
          fmt::format("cost: the long run's {} ({}) must be more than --cost-base ({})",
                      t == traffic::data ? "--messages" : "--rounds", n2, n1));
    const auto extra = n2 - n1;
    std::map<middle, std::vector<double>> per_msg;
    std::map<middle, std::pair<std::string, std::string>> last_files;  // N1, N2 of the last trial
    for (int trial = 1; trial <= s.trials; ++trial) {
      fmt_progress(fmt::format("cost {}", name_of(t)), trial, s.trials);
      for (const auto m : middles) {
        const auto f1 = runner.run(m, t, n1, trial);
        const auto f2 = runner.run(m, t, n2, trial);
        const auto ir1 = total_ir(f1);
        const auto ir2 = total_ir(f2);
        // A longer run that costs less would mean the difference is mostly noise.
        if (ir2 <= ir1)
          throw std::runtime_error(
              fmt::format("cost: {} with {} {} used no more instructions ({}) than with {} ({}): "
                          "the difference is lost in run-to-run noise; use more (--messages, "
                          "--rounds)",
                          name_of(m), n2, name_of(t), ir2, n1, ir1));
        per_msg[m].push_back(static_cast<double>(ir2 - ir1) / static_cast<double>(extra));
        last_files[m] = {f1, f2};
      }
    }

    row r;
    r.scenario = "cost";
    r.variant = t == traffic::data ? fmt::format("data event, wire {}", size_label(s.data_payload))
                                   : fmt::format("task step, wire {}", size_label(s.data_payload));
    r.metric = t == traffic::data ? "instr/msg" : "instr/step";
    r.rlbus = per_msg[middle::broker];
    r.proxy = per_msg[middle::proxy];
    r.direct = per_msg[middle::echo];
    r.params = {{"client", "wire"},
                {"payload_bytes", s.data_payload},
                {"short_run", n1},
                {"long_run", n2},
                {"window", t == traffic::data ? s.window : 1},
                {"stream_ring", stream_ring},
                {"tool", "valgrind --tool=callgrind"}};
    // Where the instructions of one more message go, per middle: a file of the top
    // functions by self and by inclusive cost per message (from the last trial's two runs)
    // and the head of callgrind_annotate's listing of the long run.
    for (const auto m : middles) {
      const auto& [f1, f2] = last_files[m];
      const auto long_listing = runner.listing(f2, false);
      const auto top =
          per_message(self_costs(runner.listing(f1, false)), self_costs(long_listing), extra);
      const auto inclusive = per_message(self_costs(runner.listing(f1, true)),
                                         self_costs(runner.listing(f2, true)), extra);
      const auto path = fmt::format("{}/cost-{}-{}-top.txt", s.log_dir, name_of(m), name_of(t));
      std::ofstream out(path);
      out << fmt::format("{} {}: self instructions per {} (the {} run minus the {} run, / {})\n",
                         name_of(m), name_of(t), t == traffic::data ? "message" : "task step", n2,
                         n1, extra);
      std::string summary =
          fmt::format("rlbus-bench: cost {} {}: top functions by self Ir per {}:\n", name_of(m),
                      name_of(t), t == traffic::data ? "msg" : "step");
      for (std::size_t i = 0; i < top.size() && i < top_in_files; ++i) {
        const auto text = fmt::format("{:12.1f}  {}\n", top[i].second, short_name(top[i].first));
        out << text;
        summary += "  " + text;
      }
      out << fmt::format("\ninclusive instructions per {} (the same difference):\n",
                         t == traffic::data ? "message" : "task step");
      for (std::size_t i = 0; i < inclusive.size() && i < top_inclusive; ++i)
        out << fmt::format("{:12.1f}  {}\n", inclusive[i].second, short_name(inclusive[i].first));
      // The whole long run, start-up and shutdown included, from the program's total on
      // (callgrind_annotate's header repeats what this file already says).
      out << fmt::format("\ncallgrind_annotate --inclusive=no {} (the whole {} run):\n", f2, n2);
      const auto from = long_listing.find("PROGRAM TOTALS");
      std::stringstream ss(
          long_listing.substr(from == std::string::npos ? 0 : long_listing.rfind('\n', from) + 1));
      std::string line;
      for (std::size_t kept = 0; std::getline(ss, line) && kept < 30; ++kept) out << line << "\n";
      if (m == middle::broker) {
        std::fputs(summary.c_str(), stderr);
        auto& j = r.params["top_self"] = nlohmann::json::array();
        for (std::size_t i = 0; i < top.size() && i < top_in_json; ++i) {
          const auto f = split_name(top[i].first);
          j.push_back({{"function", f.function},
                       {"object", f.object},
                       {"file", f.file},
                       {"ir", top[i].second}});
        }
      }
      if (s.keep_logs) {
        r.params[fmt::format("{}_top_file", name_of(m))] = path;
        std::fprintf(stderr, "rlbus-bench: cost %s %s: top functions in %s\n", name_of(m),
                     name_of(t), path.c_str());
      }
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace rlbus::bench
