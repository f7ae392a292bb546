// msgpack forms of the demo's messages. Maps with string keys, so a message stays readable
// in a dump and a field can be added without breaking older readers (unknown keys are
// skipped). Decoding is bounded: a peer's bytes never make it allocate more than they hold.
#include "demo/wire.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

#include <msgpack.hpp>

namespace rlbus::demo {

namespace {

// Small enough for every demo message, and for a hostile one to cost nothing.
const msgpack::unpack_limit limits(/*array=*/100'000, /*map=*/64, /*str=*/1 << 16,
                                   /*bin=*/1 << 20, /*ext=*/0, /*depth=*/4);

// A finite number in any msgpack encoding. msgpack-cxx writes a double with an integral
// value as an integer (9.0 goes out as 9), so a reader of doubles must take integers too.
std::optional<double> number(const msgpack::object& o) {
  double v = 0;
  switch (o.type) {
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64:
      v = o.via.f64;
      break;
    case msgpack::type::POSITIVE_INTEGER:
      v = static_cast<double>(o.via.u64);
      break;
    case msgpack::type::NEGATIVE_INTEGER:
      v = static_cast<double>(o.via.i64);
      break;
    default:
      return std::nullopt;
  }
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

class writer {
 public:
  explicit writer(std::uint32_t fields) : pk_(buf_) { pk_.pack_map(fields); }
  writer& u64(std::string_view key, std::uint64_t v) {
    pk_.pack(key);
    pk_.pack_uint64(v);
    return *this;
  }
  writer& f64(std::string_view key, double v) {
    pk_.pack(key);
    pk_.pack_double(v);
    return *this;
  }
  writer& flag(std::string_view key, bool v) {
    pk_.pack(key);
    pk_.pack(v);
    return *this;
  }
  writer& str(std::string_view key, std::string_view v) {
    pk_.pack(key);
    pk_.pack(v);
    return *this;
  }
  msgpack::packer<msgpack::sbuffer>& packer() { return pk_; }
  std::string done() { return {buf_.data(), buf_.size()}; }

 private:
  msgpack::sbuffer buf_;
  msgpack::packer<msgpack::sbuffer> pk_;
};

// Field access on one decoded map. Every getter leaves `ok()` false on a missing or
// mistyped field, so a decoder reads all fields and checks once.
class reader {
 public:
  explicit reader(const msgpack::object& o) : map_(o), ok_(o.type == msgpack::type::MAP) {}
  [[nodiscard]] bool ok() const { return ok_; }
  void invalidate() { ok_ = false; }

  [[nodiscard]] const msgpack::object* find(std::string_view key) const {
    if (map_.type != msgpack::type::MAP) return nullptr;
    for (std::uint32_t i = 0; i < map_.via.map.size; ++i) {
      const auto& kv = map_.via.map.ptr[i];
      if (kv.key.type == msgpack::type::STR &&
          std::string_view(kv.key.via.str.ptr, kv.key.via.str.size) == key)
        return &kv.val;
    }
    return nullptr;
  }
  std::uint64_t u64(std::string_view key) {
    const auto* v = find(key);
    if (v == nullptr || v->type != msgpack::type::POSITIVE_INTEGER) return fail<std::uint64_t>();
    return v->via.u64;
  }
  std::uint32_t u32(std::string_view key) {
    const auto v = u64(key);
    if (v > std::numeric_limits<std::uint32_t>::max()) return fail<std::uint32_t>();
    return static_cast<std::uint32_t>(v);
  }
  double f64(std::string_view key) {
    const auto* o = find(key);
    const auto v = o != nullptr ? number(*o) : std::nullopt;
    return v ? *v : fail<double>();
  }
  float f32(std::string_view key) {
    const double v = f64(key);
    if (std::abs(v) > static_cast<double>(std::numeric_limits<float>::max())) return fail<float>();
    return static_cast<float>(v);
  }
  bool flag(std::string_view key) {
    const auto* v = find(key);
    if (v == nullptr || v->type != msgpack::type::BOOLEAN) return fail<bool>();
    return v->via.boolean;
  }
  std::string str(std::string_view key) {
    const auto* v = find(key);
    if (v == nullptr || v->type != msgpack::type::STR) return fail<std::string>();
    return {v->via.str.ptr, v->via.str.size};
  }
  std::string bin(std::string_view key) {
    const auto* v = find(key);
    if (v == nullptr || v->type != msgpack::type::BIN) return fail<std::string>();
    return {v->via.bin.ptr, v->via.bin.size};
  }

 private:
  template <class T>
  T fail() {
    ok_ = false;
    return T{};
  }
  const msgpack::object& map_;
  bool ok_;
};

// Decodes one whole msgpack value under the limits; nullopt on malformed or trailing bytes.
std::optional<msgpack::object_handle> unpack(std::string_view bytes) {
  try {
    std::size_t offset = 0;
    auto h = msgpack::unpack(bytes.data(), bytes.size(), offset, nullptr, nullptr, limits);
    if (offset != bytes.size()) return std::nullopt;
    return std::optional<msgpack::object_handle>(std::move(h));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

template <class T, class F>
std::optional<T> decode_map(std::string_view bytes, F&& read) {
  const auto h = unpack(bytes);
  if (!h) return std::nullopt;
  reader r(h->get());
  if (!r.ok()) return std::nullopt;
  T out = read(r);
  if (!r.ok()) return std::nullopt;
  return out;
}

// A row's sign: +1 or -1 in any integer encoding; 0 for anything else.
std::int8_t row_sign(const msgpack::object& o) {
  if (o.type == msgpack::type::POSITIVE_INTEGER && o.via.u64 == 1) return 1;
  if (o.type == msgpack::type::NEGATIVE_INTEGER && o.via.i64 == -1) return -1;
  return 0;
}

}  // namespace

std::string encode(const collector_task& t) {
  writer w(6);
  w.u64("seed", t.seed)
      .f64("sigma", t.sigma)
      .u64("max_steps", t.max_steps)
      .u64("first_direction", t.first_direction)
      .u64("direction_count", t.direction_count)
      .u64("episode_cost_ms", t.episode_cost_ms);
  return w.done();
}

std::optional<collector_task> decode_collector_task(std::string_view bytes) {
  return decode_map<collector_task>(bytes, [](reader& r) {
    collector_task t;
    t.seed = r.u64("seed");
    t.sigma = r.f32("sigma");
    t.max_steps = r.u32("max_steps");
    t.first_direction = r.u32("first_direction");
    t.direction_count = r.u32("direction_count");
    t.episode_cost_ms = r.u32("episode_cost_ms");
    return t;
  });
}

std::string encode(const learner_task& t) {
  writer w(7);
  w.u64("seed", t.seed)
      .u64("directions", t.directions)
      .u64("top_directions", t.top_directions)
      .f64("sigma", t.sigma)
      .f64("step_size", t.step_size)
      .u64("max_steps", t.max_steps)
      .u64("eval_episodes", t.eval_episodes);
  return w.done();
}

std::optional<learner_task> decode_learner_task(std::string_view bytes) {
  return decode_map<learner_task>(bytes, [](reader& r) {
    learner_task t;
    t.seed = r.u64("seed");
    t.directions = r.u32("directions");
    t.top_directions = r.u32("top_directions");
    t.sigma = r.f32("sigma");
    t.step_size = r.f32("step_size");
    t.max_steps = r.u32("max_steps");
    t.eval_episodes = r.u32("eval_episodes");
    return t;
  });
}

std::string encode(const direction_result& d) {
  writer w(7);
  w.str("collector", d.collector)
      .u64("policy_version", d.plus.policy_version)
      .u64("direction", d.plus.direction)
      .f64("return_plus", d.plus.episode_return)
      .u64("steps_plus", d.plus.steps)
      .f64("return_minus", d.minus.episode_return)
      .u64("steps_minus", d.minus.steps);
  return w.done();
}

namespace {
std::optional<direction_result> read_direction_result(reader& r) {
  direction_result d;
  d.collector = r.str("collector");
  const auto version = r.u64("policy_version");
  const auto direction = r.u32("direction");
  d.plus = {version, direction, 1, r.f64("return_plus"), r.u32("steps_plus")};
  d.minus = {version, direction, -1, r.f64("return_minus"), r.u32("steps_minus")};
  if (!r.ok()) return std::nullopt;
  return d;
}
}  // namespace

std::optional<direction_result> decode_direction_result(std::string_view bytes) {
  const auto h = unpack(bytes);
  if (!h) return std::nullopt;
  reader r(h->get());
  return r.ok() ? read_direction_result(r) : std::nullopt;
}

std::optional<direction_result> direction_result_from_data(std::string_view data_event) {
  const auto h = unpack(data_event);
  if (!h) return std::nullopt;
  reader event(h->get());
  const auto* meta = event.find("meta");
  if (meta == nullptr) return std::nullopt;
  reader r(*meta);
  return r.ok() ? read_direction_result(r) : std::nullopt;
}

std::optional<std::uint64_t> policy_version_from_data(std::string_view data_event) {
  const auto h = unpack(data_event);
  if (!h) return std::nullopt;
  reader event(h->get());
  const auto* v = event.find("policy_version");
  if (v == nullptr || v->type != msgpack::type::POSITIVE_INTEGER) return std::nullopt;
  return v->via.u64;
}

std::string encode(const result_batch& b) {
  writer w(2);
  w.u64("policy_version", b.policy_version);
  auto& pk = w.packer();
  pk.pack("results");
  // Rows of [direction, sign, return, steps]: the version is the batch's.
  pk.pack_array(static_cast<std::uint32_t>(b.results.size()));
  for (const auto& r : b.results) {
    pk.pack_array(4);
    pk.pack_uint32(r.direction);
    pk.pack_int8(r.sign);
    pk.pack_double(r.episode_return);
    pk.pack_uint32(r.steps);
  }
  return w.done();
}

std::optional<result_batch> decode_result_batch(std::string_view bytes) {
  const auto h = unpack(bytes);
  if (!h) return std::nullopt;
  reader r(h->get());
  result_batch b;
  b.policy_version = r.u64("policy_version");
  const auto* rows = r.find("results");
  if (!r.ok() || rows == nullptr || rows->type != msgpack::type::ARRAY) return std::nullopt;
  b.results.reserve(rows->via.array.size);
  for (std::uint32_t i = 0; i < rows->via.array.size; ++i) {
    const auto& row = rows->via.array.ptr[i];
    if (row.type != msgpack::type::ARRAY || row.via.array.size != 4) return std::nullopt;
    const auto* f = row.via.array.ptr;
    const std::int8_t sign = row_sign(f[1]);
    const auto ret = number(f[2]);
    const bool typed = f[0].type == msgpack::type::POSITIVE_INTEGER && f[0].via.u64 <= UINT32_MAX &&
                       sign != 0 && ret && f[3].type == msgpack::type::POSITIVE_INTEGER &&
                       f[3].via.u64 <= UINT32_MAX;
    if (!typed) return std::nullopt;
    b.results.push_back({b.policy_version, static_cast<std::uint32_t>(f[0].via.u64), sign, *ret,
                         static_cast<std::uint32_t>(f[3].via.u64)});
  }
  return b;
}

std::string encode(const learn_report& l) {
  writer w(11);
  w.u64("iteration", l.iteration)
      .u64("policy_version", l.policy_version)
      .f64("batch_mean", l.batch_mean)
      .f64("batch_max", l.batch_max)
      .f64("eval_mean", l.eval_mean)
      .f64("eval_min", l.eval_min)
      .f64("eval_max", l.eval_max)
      .u64("eval_episodes", l.eval_episodes)
      .u64("episodes", l.episodes)
      .u64("eval_total", l.eval_total)
      .flag("learner_done", l.learner_done);
  return w.done();
}

std::optional<learn_report> decode_learn_report(std::string_view bytes) {
  return decode_map<learn_report>(bytes, [](reader& r) {
    learn_report l;
    l.iteration = r.u64("iteration");
    l.policy_version = r.u64("policy_version");
    l.batch_mean = r.f64("batch_mean");
    l.batch_max = r.f64("batch_max");
    l.eval_mean = r.f64("eval_mean");
    l.eval_min = r.f64("eval_min");
    l.eval_max = r.f64("eval_max");
    l.eval_episodes = r.u32("eval_episodes");
    l.episodes = r.u64("episodes");
    l.eval_total = r.u64("eval_total");
    l.learner_done = r.flag("learner_done");
    return l;
  });
}

std::string collector_done(std::uint64_t episodes) {
  writer w(2);
  w.flag("collector_done", true).u64("episodes", episodes);
  return w.done();
}

}  // namespace rlbus::demo
