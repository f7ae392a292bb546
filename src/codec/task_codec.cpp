// See task_codec.hpp. The field reader below (and the writer, field_writer.hpp) are the only
// places that know how each kind of field travels (SPEC §12.2).
#include "codec/task_codec.hpp"

#include "codec/field_writer.hpp"
#include "codec/map_writer.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace rlbus::codec::detail {

namespace {

using packer = msgpack::packer<msgpack::sbuffer>;

struct reader {
  field_reader& r;
  void operator()(std::string_view k, std::string& v, rule::id /*r*/) { r.peer_id(k, v); }
  void operator()(std::string_view k, std::string& v, rule::text t) {
    r.str(k, v, t.max);
    if (!r.fault() && v.size() < t.min) r.fail(k, "empty");
  }
  void operator()(std::string_view k, std::string& v, rule::words w) {
    r.str(k, v, 32);
    if (r.fault()) return;
    for (const auto word : w.allowed)
      if (word == v) return;
    r.fail(k, fmt::format("not one of {}", fmt::join(w.allowed, ", ")));
  }
  void operator()(std::string_view k, rlbus::role& v) { r.role(k, v); }
  void operator()(std::string_view k, rlbus::role& v, rule::kind /*r*/) { r.kind(k, v); }
  void operator()(std::string_view k, std::optional<rlbus::role>& v, rule::kind kind) {
    if (!r.has(k)) return;
    (*this)(k, v.emplace(), kind);
  }
  void operator()(std::string_view k, bool& v) { r.boolean(k, v); }
  // Flags (§17.3): absent is false or 0; a present false or 0 reads as that.
  void operator()(std::string_view k, bool& v, rule::flag /*f*/) {
    v = false;
    r.boolean(k, v, false);
  }
  template <class U>
  void operator()(std::string_view k, U& v, rule::range g, rule::flag /*f*/) {
    std::optional<U> got;
    r.opt_uint(k, got, g.lo, g.hi);
    v = got.value_or(U{0});
  }
  void operator()(std::string_view k, std::string& v, rule::topic t) {
    if (!r.str(k, v, max_topic_length)) return;
    if (v.empty() && !t.empty_ok) return r.fail(k, "empty (a topic is 1-256 characters)");
    if (!valid_topic(v, rule::topic{true}))
      r.fail(k, "a topic is printable ASCII (0x21-0x7E): no space, control or non-ASCII byte");
  }
  void operator()(std::string_view k, capacity_change& v) {
    r.word(k, v, parse_capacity_change, "increase, decrease or snapshot");
  }
  void operator()(std::string_view k, capacity_change& v, rule::no_snapshot /*r*/) {
    r.word(
        k, v,
        [](std::string_view text) {
          auto c = parse_capacity_change(text);
          return c == capacity_change::snapshot ? std::nullopt : c;
        },
        "increase or decrease");
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
  template <class Rule>
  void operator()(std::string_view k, std::optional<std::string>& v, Rule t) {
    if (!r.has(k)) return;
    (*this)(k, v.emplace(), t);
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

result<message> read_fields_message(std::uint8_t type, field_reader& r) {
  // The message whose type id this is: each alternative of `message` in turn.
  std::optional<result<message>> out;
  const auto id = static_cast<msg_type>(type);
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    const auto try_one = [&]<class T>(T* /*tag*/) {
      if (T::type != id) return false;
      out.emplace(read_as<T>(r));
      return true;
    };
    return (try_one(static_cast<std::variant_alternative_t<I, message>*>(nullptr)) || ...);
  }
  (std::make_index_sequence<std::variant_size_v<message>>{});
  if (out) return std::move(*out);
  return decode_error{error_code::unknown_type, "not a ROUTER message"};
}

void read_event_fields(field_reader& r, event& e) {
  event::fields(e, reader{r});
  std::visit(
      [&](auto& b) {
        using B = std::decay_t<decltype(b)>;
        if constexpr (!std::is_same_v<B, std::monostate>) B::fields(b, reader{r});
      },
      e.body);
}

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
// An item's fields as data_item lists them, from wherever they are (a DATA, an item).
struct item_ref {
  std::string_view data_id, buffer_id, meta;
  std::optional<std::string_view> payload;
  std::optional<std::uint64_t> policy_version;
};

void write_item(blob& out, const item_ref& item) {
  detail::blob_sink sink{out};
  msgpack::packer<detail::blob_sink> pk(sink);
  detail::field_counter n;
  data_item::fields(item, n);
  pk.pack_map(n.n);
  data_item::fields(item, detail::field_writer<detail::blob_sink>{pk, sink});
}

item_ref ref_of(const auto& d) {
  item_ref r{d.data_id, d.buffer_id, d.meta, std::nullopt, d.policy_version};
  if (d.payload) r.payload = *d.payload;
  return r;
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
  detail::blob_sink task{task_};
  msgpack::packer<detail::blob_sink>(task)
      .pack(std::string_view("task_id"))
      .pack(task_id)
      .pack(std::string_view("attempt"))
      .pack(attempt);
  detail::blob_sink worker{worker_};
  msgpack::packer<detail::blob_sink>(worker)
      .pack(std::string_view("worker_id"))
      .pack(worker_id)
      .pack(std::string_view("body"));
}

blob event_head(const event_fixed& f, std::uint64_t seq, std::string_view event,
                std::size_t reserve, bool with_kind) {
  blob out;
  out.reserve(32 + f.task_.size() + event.size() + f.worker_.size() + reserve);
  detail::blob_sink sink{out};
  msgpack::packer<detail::blob_sink> pk(sink);
  // The fields of task_event, in order (all of them required).
  static const std::uint32_t fields = field_count(task_event{});  // kind absent
  pk.pack_map(fields + (with_kind ? 1 : 0)).pack(std::string_view("seq")).pack(seq);
  out.append(f.task_);
  pk.pack(std::string_view("event")).pack(event);
  out.append(f.worker_);
  return out;
}

void event_kind(blob& out, rlbus::role kind) {
  detail::blob_sink sink{out};
  msgpack::packer<detail::blob_sink>(sink).pack(std::string_view("kind")).pack(to_string(kind));
}

items_writer::items_writer() : buf_(header_room, '\0') {}

void items_writer::add(const data_ready& d) {
  write_item(buf_, ref_of(d));
  ends_.push_back(static_cast<std::uint32_t>(buf_.size()));
}

void items_writer::add(const data_item& item) {
  write_item(buf_, ref_of(item));
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

std::optional<std::uint64_t> item_policy_version(std::string_view item) {
  detail::field_reader ir(item, decode_limits{}, true);
  thread_local data_item scratch;  // keeps its capacity from item to item
  if (ir.fault() || detail::reader::check_item(ir, &scratch)) return std::nullopt;
  return scratch.policy_version;
}

bool valid_topic(std::string_view t, rule::topic r) noexcept {
  if (t.size() > max_topic_length || (t.empty() && !r.empty_ok)) return false;
  return std::all_of(t.begin(), t.end(), [](char c) {
    const auto b = static_cast<unsigned char>(c);
    return b >= 0x21 && b <= 0x7E;
  });
}

}  // namespace rlbus::codec
