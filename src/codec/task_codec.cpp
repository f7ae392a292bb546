// See task_codec.hpp. The field visitors below are the only place that knows how each
// kind of field travels (SPEC §12.2).
#include "codec/task_codec.hpp"

#include "codec/map_writer.hpp"

namespace rlbus::codec::detail {

namespace {

using packer = msgpack::packer<msgpack::sbuffer>;

template <class V>
bool present(const V& /*v*/) {
  return true;
}
template <class V>
bool present(const std::optional<V>& v) {
  return v.has_value();
}

struct counter {
  std::uint32_t n = 0;
  template <class V, class... Rule>
  void operator()(std::string_view /*key*/, const V& v, Rule... /*rule*/) {
    n += present(v) ? 1 : 0;
  }
};

struct writer {
  packer& pk;
  msgpack::sbuffer& out;
  void operator()(std::string_view k, const std::string& v, rule::id /*r*/) { pk.pack(k).pack(v); }
  void operator()(std::string_view k, const std::string& v, rule::text /*r*/) {
    pk.pack(k).pack(v);
  }
  void operator()(std::string_view k, const rlbus::role& v, rule::kind /*r*/) {
    pk.pack(k).pack(to_string(v));
  }
  void operator()(std::string_view k, const bool& v) { pk.pack(k).pack(v); }
  void operator()(std::string_view k, const capacity_change& v) { pk.pack(k).pack(to_string(v)); }
  template <class U>
  void operator()(std::string_view k, const U& v, rule::range /*r*/) {
    pk.pack(k).pack(static_cast<std::uint64_t>(v));
  }
  template <class U>
  void operator()(std::string_view k, const std::optional<U>& v, rule::range /*r*/) {
    if (v) pk.pack(k).pack(static_cast<std::uint64_t>(*v));
  }
  void operator()(std::string_view k, const blob& v, rule::shape /*s*/) {
    pk.pack(k);
    out.write(v.data(), v.size());  // already one complete msgpack value
  }
  void operator()(std::string_view k, const item_array& v, rule::items /*r*/) {
    pk.pack(k);
    out.write(v.bytes.data(), v.bytes.size());  // the array of items, as it travels
  }
  void operator()(std::string_view k, const std::optional<blob>& v, rule::shape /*s*/) {
    if (!v) return;
    pk.pack(k);
    out.write(v->data(), v->size());
  }
  void operator()(std::string_view k, const rlbus::resources& v) {
    pk.pack(k);
    pack_resources(pk, out, v);
  }
  void operator()(std::string_view k, const std::optional<std::string>& v, rule::id /*r*/) {
    if (v) pk.pack(k).pack(*v);
  }
  void operator()(std::string_view k, const std::optional<std::string>& v, rule::text /*r*/) {
    if (v) pk.pack(k).pack(*v);
  }
  void operator()(std::string_view k, const std::optional<std::string>& v, rule::bin /*r*/) {
    if (!v) return;
    pk.pack(k);
    pk.pack_bin(static_cast<std::uint32_t>(v->size()));
    pk.pack_bin_body(v->data(), static_cast<std::uint32_t>(v->size()));
  }
};

struct reader {
  field_reader& r;
  void operator()(std::string_view k, std::string& v, rule::id /*r*/) { r.peer_id(k, v); }
  void operator()(std::string_view k, std::string& v, rule::text t) { r.str(k, v, t.max); }
  void operator()(std::string_view k, rlbus::role& v, rule::kind /*r*/) { r.kind(k, v); }
  void operator()(std::string_view k, bool& v) { r.boolean(k, v); }
  void operator()(std::string_view k, capacity_change& v) {
    r.word(k, v, parse_capacity_change, "increase, decrease or snapshot");
  }
  template <class U>
  void operator()(std::string_view k, U& v, rule::range g) {
    r.uint(k, v, g.lo, g.hi);
  }
  template <class U>
  void operator()(std::string_view k, std::optional<U>& v, rule::range g) {
    r.opt_uint(k, v, g.lo, g.hi);
  }
  void operator()(std::string_view k, blob& v, rule::shape s) { read_blob(k, v, s); }
  void operator()(std::string_view k, std::optional<blob>& v, rule::shape s) {
    if (!r.has(k)) return;
    read_blob(k, v.emplace(), s);
  }
  // Views (data_view): the same rules, the bytes left where they are.
  void operator()(std::string_view k, std::string_view& v, rule::id /*r*/) { r.peer_id(k, v); }
  void operator()(std::string_view k, std::string_view& v, rule::text t) { r.str(k, v, t.max); }
  void operator()(std::string_view k, std::string_view& v, rule::shape s) { read_blob(k, v, s); }
  void operator()(std::string_view k, std::optional<std::string_view>& v, rule::bin b) {
    v.reset();
    std::string_view bytes;
    if (r.binary(k, bytes, b.max, false)) v = bytes;
  }
  template <class S>  // blob or std::string_view
  void read_blob(std::string_view k, S& v, rule::shape s) {
    const bool map =
        s == rule::shape::map || s == rule::shape::relayed_map || s == rule::shape::batched_map;
    r.blob(k, v, true, map, !map,
           s == rule::shape::relayed_map   ? rule::max_relayed_nesting
           : s == rule::shape::batched_map ? rule::max_batched_nesting
                                           : 0);
  }
  void operator()(std::string_view k, item_array& v, rule::items it) {
    r.items(k, &v.bytes, &v.ends, it.max, [](field_reader& ir) { return check_item(ir, nullptr); });
  }
  // Why one item of a DATA_BATCH is not a data item (§12.12.2), nullopt when it is; its
  // fields go to `out` when given.
  static std::optional<std::string> check_item(field_reader& ir, data_item* out);
  void operator()(std::string_view k, rlbus::resources& v) { r.resources(k, v); }
  void operator()(std::string_view k, std::optional<std::string>& v, rule::id /*r*/) {
    if (!r.has(k)) return;
    r.peer_id(k, v.emplace());
  }
  void operator()(std::string_view k, std::optional<std::string>& v, rule::text t) {
    if (!r.has(k)) return;
    r.str(k, v.emplace(), t.max);
  }
  void operator()(std::string_view k, std::optional<std::string>& v, rule::bin b) {
    if (!r.has(k)) {
      v.reset();
      return;
    }
    r.binary(k, v ? *v : v.emplace(), b.max, true);  // a reused value keeps its capacity
  }
};

std::optional<std::string> reader::check_item(field_reader& ir, data_item* out) {
  // Read into a value of this thread's that keeps its capacity from item to item: checking a
  // batch allocates nothing once warm.
  thread_local data_item scratch;
  data_item& item = out != nullptr ? *out : scratch;
  item.policy_version.reset();
  data_item::fields(item, reader{ir});
  if (ir.fault()) return ir.fault()->reason;
  return std::nullopt;
}

template <class T>
result<message> read_as(field_reader& r) {
  T m;
  T::fields(m, reader{r});
  if (r.fault()) return *r.fault();
  // Rules that tie fields together (a message declares them in `check`).
  if constexpr (requires { T::check(m); }) {
    if (auto why = T::check(m)) return decode_error{error_code::bad_field, std::string(*why)};
  }
  return message{std::move(m)};
}

}  // namespace

result<message> read_task(std::uint8_t type, field_reader& r) {
  switch (static_cast<msg_type>(type)) {
    case msg_type::submit:
      return read_as<submit>(r);
    case msg_type::submitted:
      return read_as<submitted>(r);
    case msg_type::finish:
      return read_as<finish>(r);
    case msg_type::cancel:
      return read_as<cancel>(r);
    case msg_type::data_reply:
      return read_as<data_reply>(r);
    case msg_type::task_event:
      return read_as<task_event>(r);
    case msg_type::capacity:
      return read_as<capacity>(r);
    case msg_type::task_start:
      return read_as<task_start>(r);
    case msg_type::task_close:
      return read_as<task_close>(r);
    case msg_type::learn:
      return read_as<learn>(r);
    case msg_type::no_data:
      return read_as<no_data>(r);
    case msg_type::task_abort:
      return read_as<task_abort>(r);
    case msg_type::policy_update:
      return read_as<policy_update>(r);
    case msg_type::started:
      return read_as<started>(r);
    case msg_type::data:
      return read_as<data_ready>(r);
    case msg_type::info:
      return read_as<info>(r);
    case msg_type::get_data:
      return read_as<get_data>(r);
    case msg_type::learn_info:
      return read_as<learn_info>(r);
    case msg_type::result:
      return read_as<task_result>(r);
    case msg_type::task_failed:
      return read_as<task_failed>(r);
    case msg_type::task_alive:
      return read_as<task_alive>(r);
    case msg_type::leaving:
      return read_as<leaving>(r);
    case msg_type::policy:
      return read_as<policy>(r);
    case msg_type::replay:
      return read_as<replay>(r);
    case msg_type::ack:
      return read_as<ack>(r);
    case msg_type::stream_gap:
      return read_as<stream_gap>(r);
    case msg_type::data_credit:
      return read_as<data_credit>(r);
    case msg_type::data_ack:
      return read_as<data_ack>(r);
    case msg_type::data_lost:
      return read_as<data_lost>(r);
    case msg_type::data_batch:
      return read_as<data_batch>(r);
    case msg_type::ops:
      return read_as<ops>(r);
    case msg_type::ops_reply:
      return read_as<ops_reply>(r);
    default:
      break;
  }
  return decode_error{error_code::unknown_type, "not a task message"};
}

template <class T>
void write_task(const T& m, packer& pk, msgpack::sbuffer& out) {
  counter c;
  T::fields(m, c);
  pk.pack_map(c.n);
  T::fields(m, writer{pk, out});
}

#define RLBUS_INSTANTIATE(T) template void write_task<T>(const T&, packer&, msgpack::sbuffer&);
RLBUS_INSTANTIATE(submit)
RLBUS_INSTANTIATE(submitted)
RLBUS_INSTANTIATE(finish)
RLBUS_INSTANTIATE(cancel)
RLBUS_INSTANTIATE(data_reply)
RLBUS_INSTANTIATE(task_event)
RLBUS_INSTANTIATE(ops)
RLBUS_INSTANTIATE(ops_reply)
RLBUS_INSTANTIATE(capacity)
RLBUS_INSTANTIATE(task_start)
RLBUS_INSTANTIATE(task_close)
RLBUS_INSTANTIATE(learn)
RLBUS_INSTANTIATE(no_data)
RLBUS_INSTANTIATE(task_abort)
RLBUS_INSTANTIATE(policy_update)
RLBUS_INSTANTIATE(started)
RLBUS_INSTANTIATE(data_ready)
RLBUS_INSTANTIATE(info)
RLBUS_INSTANTIATE(get_data)
RLBUS_INSTANTIATE(learn_info)
RLBUS_INSTANTIATE(task_result)
RLBUS_INSTANTIATE(task_failed)
RLBUS_INSTANTIATE(task_alive)
RLBUS_INSTANTIATE(leaving)
RLBUS_INSTANTIATE(policy)
RLBUS_INSTANTIATE(replay)
RLBUS_INSTANTIATE(ack)
RLBUS_INSTANTIATE(stream_gap)
RLBUS_INSTANTIATE(data_credit)
RLBUS_INSTANTIATE(data_ack)
RLBUS_INSTANTIATE(data_lost)
RLBUS_INSTANTIATE(data_batch)
#undef RLBUS_INSTANTIATE

}  // namespace rlbus::codec::detail

namespace rlbus::codec {

std::string_view to_string(capacity_change c) noexcept {
  switch (c) {
    case capacity_change::increase:
      return "increase";
    case capacity_change::decrease:
      return "decrease";
    case capacity_change::snapshot:
      return "snapshot";
  }
  return "unknown";
}

std::optional<capacity_change> parse_capacity_change(std::string_view text) noexcept {
  if (text == "increase") return capacity_change::increase;
  if (text == "decrease") return capacity_change::decrease;
  if (text == "snapshot") return capacity_change::snapshot;
  return std::nullopt;
}

namespace {
struct blob_sink {  // what msgpack::packer writes to
  blob& bytes;
  void write(const char* p, std::size_t n) { bytes.append(p, n); }
};

void write_item(blob& out, std::string_view data_id, std::string_view buffer_id, const blob& meta,
                const std::optional<std::string>& payload,
                const std::optional<std::uint64_t>& policy_version) {
  blob_sink sink{out};
  msgpack::packer<blob_sink> pk(sink);
  pk.pack_map(3 + (payload ? 1 : 0) + (policy_version ? 1 : 0));
  pk.pack(std::string_view("data_id")).pack(data_id);
  pk.pack(std::string_view("buffer_id")).pack(buffer_id);
  pk.pack(std::string_view("meta"));
  out.append(meta);
  if (payload) {
    pk.pack(std::string_view("payload"));
    pk.pack_bin(static_cast<std::uint32_t>(payload->size()));
    pk.pack_bin_body(payload->data(), static_cast<std::uint32_t>(payload->size()));
  }
  if (policy_version) pk.pack(std::string_view("policy_version")).pack(*policy_version);
}
}  // namespace

blob encode_resources(const rlbus::resources& res) {
  msgpack::sbuffer out;
  msgpack::packer<msgpack::sbuffer> pk(out);
  detail::pack_resources(pk, out, res);
  return {out.data(), out.size()};
}

event_fixed::event_fixed(std::string_view task_id, std::uint32_t attempt,
                         std::string_view worker_id)
    : made_(true), attempt_(attempt), worker_id_(worker_id) {
  blob_sink task{task_};
  msgpack::packer<blob_sink>(task)
      .pack(std::string_view("task_id"))
      .pack(task_id)
      .pack(std::string_view("attempt"))
      .pack(attempt);
  blob_sink worker{worker_};
  msgpack::packer<blob_sink>(worker)
      .pack(std::string_view("worker_id"))
      .pack(worker_id)
      .pack(std::string_view("body"));
}

blob event_head(const event_fixed& f, std::uint64_t seq, std::string_view event,
                std::size_t reserve) {
  blob out;
  out.reserve(32 + f.task_.size() + event.size() + f.worker_.size() + reserve);
  blob_sink sink{out};
  msgpack::packer<blob_sink> pk(sink);
  pk.pack_map(6).pack(std::string_view("seq")).pack(seq);  // the fields of task_event, in order
  out.append(f.task_);
  pk.pack(std::string_view("event")).pack(event);
  out.append(f.worker_);
  return out;
}

items_writer::items_writer() : buf_(header_room, '\0') {}

void items_writer::add(const data_ready& d) {
  write_item(buf_, d.data_id, d.buffer_id, d.meta, d.payload, d.policy_version);
  ends_.push_back(static_cast<std::uint32_t>(buf_.size()));
}

void items_writer::add(const data_item& item) {
  write_item(buf_, item.data_id, item.buffer_id, item.meta, item.payload, item.policy_version);
  ends_.push_back(static_cast<std::uint32_t>(buf_.size()));
}

item_array items_writer::done() {
  // The header goes just before the first item, in its smallest form (§5.5).
  const auto count = ends_.size();
  std::uint32_t at = 0;
  if (count <= 15) {
    at = 2;
    buf_[2] = static_cast<char>(0x90U | count);
  } else {
    buf_[0] = static_cast<char>(0xdcU);
    buf_[1] = static_cast<char>((count >> 8U) & 0xffU);
    buf_[2] = static_cast<char>(count & 0xffU);
  }
  buf_.erase(0, at);
  for (auto& e : ends_) e -= at;
  item_array out{std::move(buf_), std::move(ends_)};
  buf_.assign(header_room, '\0');
  ends_.clear();
  return out;
}

result<data_view> read_data(std::string_view body, const decode_limits& limits) {
  detail::field_reader r(body, limits);
  data_view v;
  if (!r.fault()) data_ready::fields(v, detail::reader{r});
  if (r.fault()) return *r.fault();
  return v;
}

data_view view_of(const data_ready& d) {
  data_view v{d.task_id, d.attempt,    d.data_id,        d.buffer_id,
              d.meta,    std::nullopt, d.policy_version, d.index};
  if (d.payload) v.payload = *d.payload;
  return v;
}

result<batch_view> read_data_batch_body(std::string_view body) {
  detail::field_reader r(body, decode_limits{});
  batch_view out;
  r.uint("first_index", out.first_index, 1, std::uint64_t{1} << 63U);
  r.items("items", nullptr, nullptr, max_batch_items, [&](detail::field_reader& ir) {
    data_item item;
    auto why = detail::reader::check_item(ir, &item);
    if (!why) out.items.push_back({ir.bytes(), std::move(item.data_id), std::move(item.buffer_id)});
    return why;
  });
  if (r.fault()) return *r.fault();
  return out;
}

std::size_t nesting_of(std::string_view value) {
  return detail::nesting_levels(value);
}

std::vector<std::string_view> split_items(const item_array& items) {
  std::vector<std::string_view> out;
  const std::string_view bytes = items.bytes;
  if (items.ends.empty()) return out;
  out.reserve(items.ends.size());
  std::size_t pos = detail::read_head(bytes, 0)->data;
  for (const auto end : items.ends) {
    out.push_back(bytes.substr(pos, end - pos));
    pos = end;
  }
  return out;
}

bool is_ops_type(std::uint8_t type) noexcept {
  return type == static_cast<std::uint8_t>(msg_type::ops) ||
         type == static_cast<std::uint8_t>(msg_type::ops_reply);
}

bool is_task_type(std::uint8_t type) noexcept {
  switch (static_cast<msg_type>(type)) {
    case msg_type::submit:
    case msg_type::submitted:
    case msg_type::finish:
    case msg_type::cancel:
    case msg_type::data_reply:
    case msg_type::task_event:
    case msg_type::capacity:
    case msg_type::task_start:
    case msg_type::task_close:
    case msg_type::learn:
    case msg_type::no_data:
    case msg_type::task_abort:
    case msg_type::policy_update:
    case msg_type::started:
    case msg_type::data:
    case msg_type::info:
    case msg_type::get_data:
    case msg_type::learn_info:
    case msg_type::result:
    case msg_type::task_failed:
    case msg_type::task_alive:
    case msg_type::leaving:
    case msg_type::policy:
    case msg_type::replay:
    case msg_type::ack:
    case msg_type::stream_gap:
    case msg_type::data_credit:
    case msg_type::data_ack:
    case msg_type::data_lost:
    case msg_type::data_batch:
      return true;
    default:
      return false;
  }
}

}  // namespace rlbus::codec
