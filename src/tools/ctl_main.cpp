// rlbus-ctl: an operator's view of a running broker, and its levers, over the protocol's
// operations messages (SPEC §16): one OPS, one OPS_REPLY (or ERROR) per command. Human
// tables by default, the reply's result as JSON with --json.
//
// Exit status: 0 done; 1 no answer (the broker is not there, or did not answer within
// --timeout); 2 bad usage; 3 the broker refused (it says why).
#include <poll.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "broker/core/settings.hpp"
#include "client/core/session.hpp"
#include "cluster/group_view.hpp"
#include "codec/codec.hpp"
#include "rlbus/defaults.hpp"
#include "rlbus/types.hpp"
#include "util/endpoint_list.hpp"

namespace {

using json = nlohmann::json;

constexpr int exit_no_answer = 1;
constexpr int exit_usage = 2;
constexpr int exit_refused = 3;

// Why a command ended without a result, and with which exit status.
struct failure {
  int status;
  std::string text;
};

// The broker, or the brokers of a group (a comma-separated list): an ask goes to the one that
// answered last, and on to the leader a standby names (421) or, without an answer, to the
// next one of the list.
class broker_link {
 public:
  broker_link(const std::string& endpoints, std::optional<rlbus::curve_keys> keys)
      : endpoints_(rlbus::util::split_endpoints(endpoints)), keys_(std::move(keys)) {
    for (const auto& e : endpoints_)  // a typo is a usage error, before anything is asked
      if (e.find("://") == std::string::npos)
        throw std::invalid_argument(
            fmt::format("bad endpoint '{}' (e.g. tcp://127.0.0.1:7235, ipc:///run/rlbus.sock)", e));
    use(endpoints_.front());
  }

  /// Sends `op` and waits for its answer: the result as JSON, or why there is none.
  std::variant<json, failure> ask(const rlbus::codec::ops& op, std::chrono::milliseconds timeout) {
    // Every broker of the list once, and a leader named by each.
    for (std::size_t hops = 0; hops < 2 * endpoints_.size(); ++hops) {
      auto r = ask_one(op, timeout);
      if (const auto* leader = std::get_if<std::string>(&r)) {
        try {
          use(*leader);
        } catch (const std::invalid_argument& e) {
          return failure{exit_no_answer, fmt::format("a standby named its leader: {}", e.what())};
        }
        continue;
      }
      if (auto* f = std::get_if<failure>(&r); f && f->status == exit_no_answer &&
                                              endpoints_.size() > 1 &&
                                              hops + 1 < endpoints_.size()) {
        next_ = (next_ + 1) % endpoints_.size();
        try {
          use(endpoints_[next_]);
        } catch (const std::invalid_argument& e) {
          return failure{exit_usage, e.what()};
        }
        continue;
      }
      if (auto* f = std::get_if<failure>(&r)) return std::move(*f);
      return std::get<json>(std::move(r));
    }
    return failure{exit_no_answer, "no broker of the group leads (every one said NOT_LEADER)"};
  }

 private:
  /// A socket of its own for `endpoint`: a DEALER connected to two would share the asks.
  void use(const std::string& endpoint) {
    sock_.emplace(ctx_, zmq::socket_type::dealer);
    sock_->set(zmq::sockopt::linger, 0);
    if (keys_) {
      sock_->set(zmq::sockopt::curve_serverkey, keys_->server_key);
      sock_->set(zmq::sockopt::curve_publickey, keys_->public_key);
      sock_->set(zmq::sockopt::curve_secretkey, keys_->secret_key);
    }
    try {
      sock_->connect(endpoint);
    } catch (const zmq::error_t& e) {
      throw std::invalid_argument(
          fmt::format("bad endpoint '{}': {} (e.g. tcp://127.0.0.1:7235, ipc:///run/rlbus.sock)",
                      endpoint, e.what()));
    }
  }

  /// One broker's answer: the result, a failure, or the leader a standby named.
  std::variant<json, failure, std::string> ask_one(rlbus::codec::ops op,
                                                   std::chrono::milliseconds timeout) {
    auto& sock = *sock_;
    op.request_id = ++next_id_;
    const auto header = rlbus::codec::make_header(rlbus::codec::msg_type::ops);
    const auto body = rlbus::codec::encode_body(rlbus::codec::message{op});
    sock.send(zmq::buffer(header.data(), header.size()), zmq::send_flags::sndmore);
    sock.send(zmq::buffer(body), zmq::send_flags::none);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      zmq::pollitem_t item{sock.handle(), 0, ZMQ_POLLIN, 0};
      if (left.count() <= 0 || zmq::poll(&item, 1, left) == 0)
        return failure{exit_no_answer,
                       fmt::format("no answer within {} ms (is a broker at {}?)", timeout.count(),
                                   sock.get(zmq::sockopt::last_endpoint))};
      std::vector<zmq::message_t> frames;
      do {
        frames.emplace_back();
        (void)sock.recv(frames.back(), zmq::recv_flags::none);
      } while (frames.back().more());
      if (frames.size() != 2) continue;
      const auto h = rlbus::codec::parse_header(frames[0].to_string_view());
      if (!h) continue;
      auto m = rlbus::codec::decode_body(h->type, frames[1].to_string_view());
      if (!m && (h->type == static_cast<std::uint8_t>(rlbus::codec::msg_type::ops_reply) ||
                 h->type == static_cast<std::uint8_t>(rlbus::codec::msg_type::error)))
        return failure{exit_no_answer,
                       fmt::format("the broker answered, but its answer cannot be read: {} {}",
                                   static_cast<int>(m.error().code), m.error().reason)};
      if (!m) continue;
      if (auto* r = std::get_if<rlbus::codec::ops_reply>(&m.value())) {
        if (r->request_id != op.request_id) continue;  // an answer to an earlier, timed-out ask
        const auto& bytes = r->result;
        return json::from_msgpack(bytes.begin(), bytes.end());
      }
      auto* e = std::get_if<rlbus::codec::error>(&m.value());
      if (e == nullptr) continue;
      if (e->code == static_cast<std::uint16_t>(rlbus::codec::error_code::not_leader) && e->leader)
        return *e->leader;
      return failure{exit_refused, fmt::format("the broker refused: {} {}: {}", e->code,
                                               rlbus::codec::code_name(e->code), e->reason)};
    }
  }

  std::vector<std::string> endpoints_;
  std::size_t next_ = 0;
  std::optional<rlbus::curve_keys> keys_;
  zmq::context_t ctx_{1};
  std::optional<zmq::socket_t> sock_;
  std::uint64_t next_id_ = 0;
};

// ---- human output -------------------------------------------------------------------------

std::string text_of(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  if (v.is_object()) {
    std::string out;
    for (const auto& [k, x] : v.items()) out += (out.empty() ? "" : ",") + k + "=" + text_of(x);
    return out.empty() ? "-" : out;
  }
  return v.dump();
}

std::string age(const json& ms) {
  const auto v = ms.get<std::uint64_t>();
  if (v < 10'000) return fmt::format("{}ms", v);
  if (v < 600'000) return fmt::format("{}s", v / 1000);
  if (v < 36'000'000) return fmt::format("{}m", v / 60'000);
  return fmt::format("{}h", v / 3'600'000);
}

// A table's lines: each column as wide as its widest cell, two spaces apart.
std::vector<std::string> table_lines(const std::vector<std::string>& head,
                                     const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width(head.size());
  for (std::size_t i = 0; i < head.size(); ++i) width[i] = head[i].size();
  for (const auto& r : rows)
    for (std::size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  std::vector<std::string> lines;
  const auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (std::size_t i = 0; i < cells.size(); ++i)
      out += i + 1 == cells.size() ? cells[i] : fmt::format("{:<{}}  ", cells[i], width[i]);
    lines.push_back(std::move(out));
  };
  line(head);
  for (const auto& r : rows) line(r);
  return lines;
}

void table(const std::vector<std::string>& head,
           const std::vector<std::vector<std::string>>& rows) {
  for (const auto& l : table_lines(head, rows)) std::puts(l.c_str());
}

void print_status(const json& s) {
  const auto& p = s.at("peers");
  const auto& t = s.at("tasks");
  std::printf("uptime       %s%s\n", age(s.at("uptime_ms")).c_str(),
              s.at("draining").get<bool>() ? "  (draining)" : "");
  std::printf("peers        %s collectors, %s learners, %s coordinators\n",
              p.at("collector").dump().c_str(), p.at("learner").dump().c_str(),
              p.at("coordinator").dump().c_str());
  std::printf("tasks        %s queued, %s running\n", t.at("queued").dump().c_str(),
              t.at("running").dump().c_str());
  std::string counters;
  for (const auto& [k, v] : s.at("counters").items())
    counters += fmt::format("{}{}={}", counters.empty() ? "" : " ", k, v.dump());
  std::printf("counters     %s\n", counters.c_str());
  if (!s.at("streams").empty()) {
    std::puts("");
    std::vector<std::vector<std::string>> rows;
    for (const auto& st : s.at("streams"))
      rows.push_back({text_of(st.at("coordinator")), st.at("seq").dump(), st.at("acked").dump(),
                      text_of(st.at("windowed")), st.at("held").dump()});
    table({"STREAM", "SEQ", "ACKED", "WINDOWED", "HELD"}, rows);
  }
  if (!s.at("changes").empty()) {
    std::puts("");
    std::vector<std::vector<std::string>> rows;
    for (const auto& c : s.at("changes"))
      rows.push_back({text_of(c.at("key")), text_of(c.at("value")), text_of(c.at("was")),
                      age(c.at("age_ms")) + " ago"});
    table({"CHANGED", "VALUE", "WAS", "WHEN"}, rows);
  }
}

void print_workers(const json& r) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& w : r.at("workers")) {
    std::string flags;
    for (const auto* f : {"quarantined", "leaving", "drained"})
      if (w.at(f).get<bool>()) flags += (flags.empty() ? "" : ",") + std::string(f);
    rows.push_back({text_of(w.at("id")), text_of(w.at("role")),
                    w.at("task").get<std::string>().empty() ? "-" : text_of(w.at("task")),
                    w.at("attempt").get<std::uint64_t>() == 0 ? "-" : w.at("attempt").dump(),
                    age(w.at("heartbeat_age_ms")), flags.empty() ? "-" : flags,
                    text_of(w.at("resources"))});
  }
  table({"WORKER", "ROLE", "TASK", "ATTEMPT", "LAST SEEN", "FLAGS", "RESOURCES"}, rows);
  if (r.at("total").get<std::size_t>() > rows.size())
    std::printf("(%zu of %s shown: --limit)\n", rows.size(), r.at("total").dump().c_str());
}

void print_tasks(const json& r) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& t : r.at("tasks"))
    rows.push_back({text_of(t.at("id")), text_of(t.at("kind")), text_of(t.at("state")),
                    t.at("attempt").dump(),
                    t.at("worker").get<std::string>().empty() ? "-" : text_of(t.at("worker")),
                    text_of(t.at("coordinator")), age(t.at("age_ms"))});
  table({"TASK", "KIND", "STATE", "ATTEMPT", "WORKER", "COORDINATOR", "AGE"}, rows);
  if (r.at("total").get<std::size_t>() > rows.size())
    std::printf("(%zu of %s shown: --limit)\n", rows.size(), r.at("total").dump().c_str());
}

void print_topics(const json& r) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& t : r.at("topics"))
    rows.push_back({text_of(t.at("topic")), t.at("messages").dump(), t.at("bytes").dump(),
                    t.at("subscribers").dump()});
  table({"TOPIC", "MESSAGES", "BYTES", "SUBSCRIBERS"}, rows);
  if (r.at("topics_total").get<std::size_t>() > rows.size())
    std::printf("(%zu of %s topics shown: --limit)\n", rows.size(),
                r.at("topics_total").dump().c_str());
  std::puts("");
  rows.clear();
  for (const auto& n : r.at("nodes")) {
    // As a publisher: held back by whom; as a subscriber: stalled, or holding whom back.
    std::string credit = "-";
    if (n.at("held_back").get<bool>())
      credit = n.at("held_by").get<std::string>().empty()
                   ? "held back"
                   : "held back by " + text_of(n.at("held_by"));
    std::string holding = n.at("stalled").get<bool>() ? "stalled" : "-";
    if (!n.at("holding_back").empty()) {
      holding = "holds back " + text_of(n.at("holding_back").at(0));
      if (n.at("holding_back").size() > 1)
        holding += fmt::format(" and {} more", n.at("holding_back").size() - 1);
    }
    rows.push_back({text_of(n.at("id")), n.at("subscriptions").dump(), n.at("queued").dump(),
                    n.at("queued_bytes").dump(), n.at("dropped").dump(), n.at("published").dump(),
                    credit, holding});
  }
  table({"NODE", "SUBSCRIPTIONS", "LAG", "LAG BYTES", "DROPPED", "PUBLISHED", "CREDIT", "QUEUE"},
        rows);
  if (r.at("nodes_total").get<std::size_t>() > rows.size())
    std::printf("(%zu of %s nodes shown, the laggiest first: --limit)\n", rows.size(),
                r.at("nodes_total").dump().c_str());
}

void print_human(const std::string& verb, const json& r) {
  if (verb == "status") return print_status(r);
  if (verb == "topics") return print_topics(r);
  if (verb == "workers") return print_workers(r);
  if (verb == "tasks") return print_tasks(r);
  const auto task = r.value("task", std::string());
  const auto worker = r.value("worker", std::string());
  if (verb == "drain")
    std::printf("worker %s drained: no new task%s\n", worker.c_str(),
                task.empty() ? "" : fmt::format(" (its task {} runs on)", task).c_str());
  else if (verb == "undrain")
    std::printf("worker %s may get tasks again\n", worker.c_str());
  else if (verb == "evict")
    std::printf("worker %s evicted%s\n", worker.c_str(),
                task.empty() ? "" : fmt::format("; its task {} was handed back", task).c_str());
  else if (verb == "set")
    std::printf("%s = %s (was %s)\n", r.at("key").get<std::string>().c_str(),
                r.at("value").get<std::string>().c_str(), r.at("was").get<std::string>().c_str());
}

// rlbus-ctl cluster: the group as etcd holds it, asked of etcd itself (a group whose brokers
// all stand by, or that has none, is shown too).
int show_cluster(const std::string& etcd_urls, const std::string& group,
                 std::chrono::milliseconds timeout, bool as_json,
                 const std::optional<rlbus::curve_keys>& keys) {
  rlbus::cluster::group_view g;
  try {
    g = rlbus::cluster::read_group(rlbus::util::split_endpoints(etcd_urls), group, timeout);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "rlbus-ctl: %s\n", e.what());
    return exit_usage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rlbus-ctl: group %s: %s\n", group.c_str(), e.what());
    return exit_no_answer;
  }
  const auto& leader = g.leader;
  // Each standby's lag, as the leader knows it (when it answers in time).
  std::map<std::string, json> lag;
  if (leader.epoch != 0) {
    try {
      broker_link link(leader.advertise, keys);
      rlbus::codec::ops op;
      op.verb = "status";
      auto r = link.ask(op, timeout);
      if (auto* status = std::get_if<json>(&r); status && status->contains("standbys"))
        for (const auto& st : (*status)["standbys"])
          lag[st.value("member", "")] = {{"position", st.value("position", 0)},
                                         {"lag_bytes", st.value("lag_bytes", 0)}};
    } catch (const std::exception&) {  // the view of etcd stands on its own
    }
  }
  const auto now_ms = static_cast<std::int64_t>(rlbus::util::wall_ms());
  const auto for_ms = [&](std::int64_t since) {
    return json(static_cast<std::uint64_t>(std::max<std::int64_t>(now_ms - since, 0)));
  };
  if (as_json) {
    auto out = rlbus::cluster::to_json(g);
    for (auto& one : out["members"])
      if (const auto it = lag.find(one["member"].get<std::string>()); it != lag.end())
        one.update(it->second);
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  if (leader.epoch == 0)
    std::printf("group %s: no leader (an election is under way, or no broker is up)\n",
                group.c_str());
  else
    std::printf("group %s: %s leads, at %s (epoch %lld, for %s)\n", group.c_str(),
                leader.member.c_str(), leader.advertise.c_str(),
                static_cast<long long>(leader.epoch), age(for_ms(leader.since_ms)).c_str());
  std::vector<std::vector<std::string>> rows;
  for (const auto& m : g.members) {
    const auto it = lag.find(m.member);
    rows.push_back(
        {m.member, m.member == leader.member ? "leader" : "standby", m.advertise, m.version,
         age(for_ms(m.since_ms)), g.in_sync.count(m.member) == 1 ? "yes" : "no",
         it == lag.end() ? "-"
                         : fmt::format("{} B", it->second["lag_bytes"].get<std::uint64_t>())});
  }
  std::puts("");
  table({"MEMBER", "ROLE", "ADVERTISE", "VERSION", "UP", "IN SYNC", "LAG"}, rows);
  return 0;
}

}  // namespace

// ---- top: a live view of the broker, refreshed in place --------------------------------------

// One refresh's replies (rates come from two refreshes' status counters, over the time
// between their uptimes).
struct top_sample {
  json status, workers, tasks, topics;
};

std::string rate(const json& now, const json& before, const char* map, const char* key,
                 double seconds) {
  if (before.is_null() || seconds <= 0) return "-";
  const auto a = before.at(map).value(key, std::uint64_t{0});
  const auto b = now.at(map).value(key, std::uint64_t{0});
  return fmt::format("{:.1f}", b >= a ? static_cast<double>(b - a) / seconds : 0.0);
}

std::string bytes(std::uint64_t n) {
  if (n < 10'240) return fmt::format("{} B", n);
  if (n < 10'485'760) return fmt::format("{} KiB", n / 1024);
  return fmt::format("{} MiB", n >> 20U);
}

// The lines of one frame: a summary, then workers, tasks and topics, each table cut to `rows`
// lines of entries.
std::vector<std::string> top_frame(const std::string& endpoint, unsigned interval_ms,
                                   bool interactive, const top_sample& now,
                                   const json& before_status, std::size_t rows) {
  std::vector<std::string> out;
  const auto& s = now.status;
  const auto& p = s.at("peers");
  const double seconds =
      before_status.is_null()
          ? 0
          : static_cast<double>(s.at("uptime_ms").get<std::uint64_t>() -
                                std::min(s.at("uptime_ms").get<std::uint64_t>(),
                                         before_status.at("uptime_ms").get<std::uint64_t>())) /
                1000.0;
  out.push_back(fmt::format("rlbus-ctl top  {}  every {} ms{}", endpoint, interval_ms,
                            interactive ? "  (q quits)" : ""));
  out.push_back(fmt::format("broker {} epoch {:016x}  up {}{}", s.value("version", "?"),
                            s.value("epoch", std::uint64_t{0}), age(s.at("uptime_ms")),
                            s.at("draining").get<bool>() ? "  DRAINING" : ""));
  out.push_back(fmt::format("sessions  {} collectors, {} learners, {} coordinators, {} bus nodes",
                            p.at("collector").dump(), p.at("learner").dump(),
                            p.at("coordinator").dump(), p.at("bus").dump()));
  out.push_back(fmt::format(
      "tasks     {} queued, {} running; per second: {} finished, {} re-queued, {} failed",
      s.at("tasks").at("queued").dump(), s.at("tasks").at("running").dump(),
      rate(s, before_status, "counters", "tasks_finished", seconds),
      rate(s, before_status, "counters", "tasks_requeued", seconds),
      rate(s, before_status, "counters", "tasks_failed", seconds)));
  out.push_back(
      fmt::format("per s     messages {} in, {} out; bus {} published, {} delivered, {} dropped",
                  rate(s, before_status, "counters", "messages_in", seconds),
                  rate(s, before_status, "counters", "messages_out", seconds),
                  rate(s, before_status, "bus", "published", seconds),
                  rate(s, before_status, "bus", "delivered", seconds),
                  rate(s, before_status, "bus", "dropped", seconds)));
  out.push_back(fmt::format("memory    send queues {}, stream rings {}, bus queues {}",
                            bytes(s.at("counters").value("send_queue_bytes", std::uint64_t{0})),
                            bytes(s.at("counters").value("stream_ring_bytes", std::uint64_t{0})),
                            bytes(s.at("bus").value("queued_bytes", std::uint64_t{0}))));
  const auto section = [&](const std::string& title, std::size_t shown, std::size_t total,
                           std::vector<std::string> lines) {
    out.emplace_back();
    out.push_back(fmt::format("{} ({} of {})", title, shown, total));
    for (auto& l : lines) out.push_back(std::move(l));
  };
  std::vector<std::vector<std::string>> w;
  for (const auto& x : now.workers.at("workers")) {
    if (w.size() == rows) break;
    const auto state = x.at("quarantined").get<bool>()           ? "quarantined"
                       : x.at("leaving").get<bool>()             ? "leaving"
                       : x.at("drained").get<bool>()             ? "drained"
                       : x.at("task").get<std::string>().empty() ? "idle"
                                                                 : "busy";
    w.push_back({text_of(x.at("id")), text_of(x.at("role")), state,
                 x.at("task").get<std::string>().empty() ? "-" : text_of(x.at("task")),
                 age(x.at("heartbeat_age_ms"))});
  }
  section("WORKERS", w.size(), now.workers.at("total").get<std::size_t>(),
          table_lines({"WORKER", "ROLE", "STATE", "TASK", "LAST SEEN"}, w));
  std::vector<std::vector<std::string>> t;
  for (const auto& x : now.tasks.at("tasks")) {
    if (t.size() == rows) break;
    t.push_back({text_of(x.at("id")), text_of(x.at("kind")), text_of(x.at("state")),
                 x.at("attempt").dump(),
                 x.at("worker").get<std::string>().empty() ? "-" : text_of(x.at("worker")),
                 text_of(x.at("coordinator")), age(x.at("age_ms"))});
  }
  section("TASKS", t.size(), now.tasks.at("total").get<std::size_t>(),
          table_lines({"TASK", "KIND", "STATE", "ATTEMPT", "WORKER", "COORDINATOR", "AGE"}, t));
  std::vector<std::vector<std::string>> b;
  for (const auto& x : now.topics.at("topics")) {
    if (b.size() == rows) break;
    b.push_back({text_of(x.at("topic")), x.at("messages").dump(),
                 bytes(x.at("bytes").get<std::uint64_t>()), x.at("subscribers").dump()});
  }
  section("TOPICS", b.size(), now.topics.at("topics_total").get<std::size_t>(),
          table_lines({"TOPIC", "MESSAGES", "BYTES", "SUBSCRIBERS"}, b));
  return out;
}

std::atomic<bool> top_interrupted{false};

// The terminal as top needs it while it runs, given back as it was however top ends: keys
// read one at a time without echo, the screen of its own, no cursor.
class raw_terminal {
 public:
  raw_terminal() {
    if (::tcgetattr(STDIN_FILENO, &saved_) == 0) {
      termios raw = saved_;
      raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
      raw.c_cc[VMIN] = 0;
      raw.c_cc[VTIME] = 0;
      restore_ = ::tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
    }
    std::fputs("\x1b[?1049h\x1b[?25l", stdout);
  }
  ~raw_terminal() {
    std::fputs("\x1b[?25h\x1b[?1049l", stdout);
    std::fflush(stdout);
    if (restore_) ::tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  raw_terminal(const raw_terminal&) = delete;
  raw_terminal& operator=(const raw_terminal&) = delete;

 private:
  termios saved_{};
  bool restore_ = false;
};

// Waits up to `ms` for a key; whether it was q (or Ctrl-C came).
bool quit_asked(unsigned ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!top_interrupted) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd in{STDIN_FILENO, POLLIN, 0};
    if (::poll(&in, 1, static_cast<int>(left.count())) <= 0) continue;  // EINTR: look again
    char c = 0;
    if (::read(STDIN_FILENO, &c, 1) == 1 && (c == 'q' || c == 'Q')) return true;
    if ((in.revents & (POLLHUP | POLLERR)) != 0) {  // no keys will come: wait out the interval
      std::this_thread::sleep_for(left);
      return false;
    }
  }
  return true;
}

template <class Ask>
int run_top(Ask&& ask, const std::string& endpoint, unsigned interval_ms, std::uint32_t count,
            std::uint32_t rows_wanted) {
  const bool interactive = ::isatty(STDOUT_FILENO) == 1;
  std::optional<raw_terminal> term;
  if (interactive) {
    term.emplace();
    std::signal(SIGINT, [](int) { top_interrupted = true; });
  }
  rlbus::codec::ops status, workers, tasks, topics;
  status.verb = "status";
  workers.verb = "workers";
  tasks.verb = "tasks";
  topics.verb = "topics";
  json before;
  for (std::uint32_t n = 0; count == 0 || n < count; ++n) {
    if (n > 0) {
      if (!interactive)
        std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
      else if (quit_asked(interval_ms))
        break;
    }
    // A frame fits the terminal: its summary and three titled tables.
    std::size_t rows = rows_wanted;
    if (interactive && rows_wanted == 0) {
      winsize ws{};
      const std::size_t height =
          ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 ? ws.ws_row : 24;
      rows = height > 6 + 9 + 3 ? (height - 6 - 9) / 3 : 1;
    } else if (rows_wanted == 0) {
      rows = 20;
    }
    workers.limit = tasks.limit = topics.limit = static_cast<std::uint32_t>(rows);
    const top_sample now{ask(status), ask(workers), ask(tasks), ask(topics)};
    const auto lines = top_frame(endpoint, interval_ms, interactive, now, before, rows);
    before = now.status;
    if (interactive) {
      std::string frame = "\x1b[H";
      for (const auto& l : lines) frame += l + "\x1b[K\n";
      frame += "\x1b[J";
      std::fputs(frame.c_str(), stdout);
    } else {
      if (n > 0) std::puts("");
      for (const auto& l : lines) std::puts(l.c_str());
    }
    std::fflush(stdout);
    if (top_interrupted) break;
  }
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{
      "rlbus-ctl: look inside a running rlbus broker and steer it.\n"
      "Talks to the broker's ROUTER endpoint with the protocol's operations messages; with\n"
      "CURVE on, give a key pair the broker's allowlist lists with the role `operator`.\n"
      "Exit status: 0 done, 1 no answer from the broker, 2 bad usage, 3 the broker refused."};
  app.require_subcommand(1);
  app.fallthrough();  // the global options go before or after the verb, as kubectl takes them
  std::string endpoint{rlbus::defaults::router_endpoint};
  app.add_option("--broker", endpoint,
                 "the broker's ROUTER endpoint, or a group's brokers separated by commas (the "
                 "leader answers)")
      ->envname("RLBUS_ENDPOINT")
      ->capture_default_str();
  bool as_json = false;
  app.add_flag("--json", as_json, "print the broker's answer as JSON (one object per answer)");
  std::uint32_t timeout_ms = 5000;
  app.add_option("--timeout", timeout_ms, "ms to wait for an answer")
      ->capture_default_str()
      ->check(CLI::Range(1U, 3'600'000U));
  std::string key_file, broker_key_file;
  auto* key_opt = app.add_option("--curve-key", key_file,
                                 "this operator's key pair (.key), when the broker has CURVE on")
                      ->envname("RLBUS_CURVE_KEY");
  app.add_option("--broker-key", broker_key_file, "the broker's public key (.pub)")
      ->envname("RLBUS_BROKER_KEY")
      ->needs(key_opt);
  key_opt->needs("--broker-key");

  rlbus::codec::ops op;
  std::uint32_t interval_ms = 1000, count = 0;
  app.add_subcommand("status", "uptime, peers by role, tasks, streams, counters");
  auto* cluster = app.add_subcommand(
      "cluster", "a group of brokers as etcd holds it: who leads, since when, every member");
  std::string cluster_etcd, cluster_name = "rlbus";
  cluster->add_option("--etcd", cluster_etcd, "etcd's client URLs, comma-separated")
      ->envname("RLBUS_BROKER_CLUSTER_ETCD")
      ->required();
  cluster->add_option("--name", cluster_name, "the group's name (the brokers' --cluster-name)")
      ->envname("RLBUS_BROKER_CLUSTER_NAME")
      ->capture_default_str();
  auto* workers = app.add_subcommand("workers", "every worker session, with its task");
  auto* tasks = app.add_subcommand("tasks", "live tasks, queued first, in queue order");
  auto* topics = app.add_subcommand(
      "topics", "the topic bus: the busiest topics, and its nodes, the laggiest first");
  auto* watch = app.add_subcommand("watch", "status and workers, refreshed in place");
  auto* top = app.add_subcommand(
      "top",
      "a live view in the manner of top: sessions, tasks and traffic per second, workers, "
      "tasks and topics, refreshed in place (q quits); plain text, frame after frame, when "
      "the output is not a terminal");
  auto* drain = app.add_subcommand("drain", "give WORKER no new task (its task runs on)");
  auto* undrain = app.add_subcommand("undrain", "let a drained WORKER get tasks again");
  auto* evict =
      app.add_subcommand("evict", "hand WORKER's task back to the queue and end its session");
  // The settings a broker may change at run time, from its table (the broker judges).
  auto* set =
      app.add_subcommand("set", fmt::format("change a setting at run time: {}",
                                            fmt::join(rlbus::broker::live_setting_keys(), ", ")));
  std::string kind, state, coordinator, worker, key, value;
  std::uint32_t limit = 0;
  for (auto* c : {workers, tasks}) {
    c->add_option("--kind", kind, "collector or learner")
        ->check(CLI::IsMember({"collector", "learner"}));
    c->add_option("--limit", limit, "most entries (1..10000; default 1000)")
        ->check(CLI::Range(1U, 10'000U));
  }
  topics->add_option("--limit", limit, "most topics and nodes shown (1..1000; default 1000)")
      ->check(CLI::Range(1U, 1000U));
  tasks->add_option("--state", state, "queued, starting, running or closing")
      ->check(CLI::IsMember({"queued", "starting", "running", "closing"}));
  tasks->add_option("--coordinator", coordinator, "only this coordinator's tasks");
  std::uint32_t top_rows = 0;
  for (auto* c : {watch, top}) {
    c->add_option("--interval", interval_ms, "ms between refreshes")
        ->capture_default_str()
        ->check(CLI::Range(100U, 3'600'000U));
    c->add_option("--count", count, "refreshes before it stops (0: until interrupted or q)")
        ->capture_default_str();
  }
  top->add_option("--rows", top_rows,
                  "entries of each table (default: what fits the terminal; 20 when the output "
                  "is not one)")
      ->check(CLI::Range(1U, 1000U));
  for (auto* c : {drain, undrain, evict})
    c->add_option("worker", worker, "the worker's id")->required();
  set->add_option("key", key,
                  "the setting, as the config file names it (one of those above; a broker of "
                  "another version judges by its own list)")
      ->required();
  set->add_option("value", value, "its new value")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return exit_usage;
  }

  std::optional<rlbus::curve_keys> keys;
  if (!key_file.empty()) {
    try {
      keys = rlbus::curve_keys_from_files(key_file, broker_key_file);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rlbus-ctl: %s\n", e.what());
      return exit_usage;
    }
  }
  auto* chosen = app.get_subcommands().front();
  if (chosen == cluster)
    return show_cluster(cluster_etcd, cluster_name, std::chrono::milliseconds(timeout_ms), as_json,
                        keys);
  op.verb = chosen == watch || chosen == top ? "status" : chosen->get_name();
  if (!kind.empty()) op.kind = rlbus::parse_role(kind);  // collector or learner: checked above
  if (!state.empty()) op.state = state;
  if (!coordinator.empty()) op.coordinator = coordinator;
  if (limit != 0) op.limit = limit;
  if (!worker.empty()) op.worker = worker;
  if (chosen == set) {
    op.key = key;
    op.value = value;
  }

  std::optional<broker_link> link;
  try {
    link.emplace(endpoint, keys);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "rlbus-ctl: %s\n", e.what());
    return exit_usage;
  }
  auto& broker = *link;
  const auto timeout = std::chrono::milliseconds(timeout_ms);
  const auto ask = [&](const rlbus::codec::ops& o) -> json {  // exits when there is none
    auto r = broker.ask(o, timeout);
    if (auto* f = std::get_if<failure>(&r)) {
      std::fprintf(stderr, "rlbus-ctl: %s\n", f->text.c_str());
      std::exit(f->status);
    }
    return std::get<json>(std::move(r));
  };
  // A list longer than a page (§16.3.2) is asked for page by page, up to the limit.
  const auto ask_all = [&](rlbus::codec::ops o, const char* list) -> json {
    const std::size_t want = o.limit.value_or(1000);
    auto r = ask(o);
    while (r.contains(list) && r.contains("total")) {
      const auto got = r[list].size();
      const auto total = r["total"].get<std::size_t>();
      if (got >= want || got >= total) break;
      o.offset = got;
      o.limit = static_cast<std::uint32_t>(want - got);
      auto next = ask(o);
      if (!next.contains(list) || next[list].empty()) break;
      for (auto& item : next[list]) r[list].push_back(std::move(item));
      r["total"] = next["total"];
    }
    return r;
  };
  if (chosen == top) return run_top(ask, endpoint, interval_ms, count, top_rows);
  if (chosen != watch) {
    const auto r = chosen == tasks || chosen == workers
                       ? ask_all(op, chosen == tasks ? "tasks" : "workers")
                       : ask(op);
    if (as_json)
      std::cout << r.dump(2) << "\n";
    else
      print_human(op.verb, r);
    return 0;
  }
  rlbus::codec::ops list_workers;
  list_workers.verb = "workers";
  for (std::uint32_t n = 0; count == 0 || n < count; ++n) {
    if (n > 0) std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
    const auto s = ask(op);
    const auto w = ask(list_workers);
    if (as_json) {
      std::cout << json{{"status", s}, {"workers", w}}.dump() << std::endl;
      continue;
    }
    std::fputs("\x1b[H\x1b[2J", stdout);  // refreshed in place
    std::printf("rlbus-ctl watch %s, every %u ms\n\n", endpoint.c_str(), interval_ms);
    print_status(s);
    std::puts("");
    print_workers(w);
    std::fflush(stdout);
  }
  return 0;
}
