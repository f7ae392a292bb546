// The message model (protocol/messages.json) against the C++ codec's own field tables: every
// message's fields() (generated from messages.json into codec/model.hpp by protocol/gen_cpp.py:
// this is the generator's test), the event envelope and every event body the codec writes, and
// every TASK_EVENT body the broker composes (codec::event_body, generated as views). The tables are
// walked by a visitor that says what each field is in messages.json's words (type, required,
// bounds), so a field changed in the C++ tables alone, or in messages.json alone, fails here; the
// Python codec is driven by messages.json itself.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "codec/codec.hpp"
#include "codec/messages.hpp"

using namespace rlbus;
using json = nlohmann::json;
namespace rule = codec::rule;

namespace {

json load_model() {
  const char* dir = std::getenv("RLBUS_PROTOCOL_DIR");
  REQUIRE(dir != nullptr);
  std::ifstream in(std::string(dir) + "/messages.json");
  REQUIRE(in.good());
  return json::parse(in);
}

template <class V>
struct optional_of {
  using type = V;
  static constexpr bool optional = false;
};
template <class V>
struct optional_of<std::optional<V>> {
  using type = V;
  static constexpr bool optional = true;
};

template <class T>
json describe();

json words(std::span<const std::string_view> w) {
  json out = json::array();
  for (const auto x : w) out.push_back(std::string(x));
  return out;
}

// Says what one field of a table is, in messages.json's vocabulary.
struct describer {
  json& out;

  template <class V, class... Rule>
  void operator()(std::string_view name, const V& /*v*/, Rule... r) {
    using O = optional_of<V>;
    json f = {{"name", std::string(name)}, {"required", !O::optional}};
    what(f, static_cast<const typename O::type*>(nullptr), r...);
    out.push_back(std::move(f));
  }
  // A flag (§17.3): optional, with the default it reads as when absent.
  void operator()(std::string_view name, const bool& /*v*/, rule::flag /*f*/) {
    out.push_back(
        {{"name", std::string(name)}, {"type", "bool"}, {"required", false}, {"default", false}});
  }
  template <class U>
  requires std::is_integral_v<U>
  void operator()(std::string_view name, const U& /*v*/, rule::range g, rule::flag /*f*/) {
    json f = {{"name", std::string(name)}, {"required", false}, {"default", 0}};
    what(f, static_cast<const U*>(nullptr), g);
    out.push_back(std::move(f));
  }

  template <class S>
  static constexpr bool is_text =
      std::is_same_v<S, std::string> || std::is_same_v<S, std::string_view>;

  template <class S>
  requires is_text<S>
  static void what(json& f, const S* /*v*/, rule::id /*r*/) {
    f["type"] = "str";
    f["min_length"] = 1;
    f["max_length"] = codec::max_id_length;
    f["pattern"] = "^[A-Za-z0-9._:@/-]{1,128}$";
  }
  template <class S>
  requires is_text<S>
  static void what(json& f, const S* /*v*/, rule::text t) {
    f["type"] = "str";
    if (t.min > 0) f["min_length"] = t.min;
    f["max_length"] = t.max;
  }
  template <class S>
  requires is_text<S>
  static void what(json& f, const S* /*v*/, rule::words w) {
    f["type"] = "str";
    f["enum"] = words(w.allowed);
  }
  template <class S>
  requires is_text<S>
  static void what(json& f, const S* /*v*/, rule::shape s) {
    f["type"] = s == rule::shape::any ? "msgpack-any" : "msgpack-map";
    f["verbatim"] = true;
    if (s == rule::shape::relayed_map) f["max_nesting"] = rule::max_relayed_nesting;
    if (s == rule::shape::batched_map) f["max_nesting"] = rule::max_batched_nesting;
  }
  template <class S>
  requires is_text<S>
  static void what(json& f, const S* /*v*/, rule::bin b) {
    f["type"] = "bin";
    if (b.max != ~std::size_t{0}) f["max_length"] = b.max;
  }
  template <class S>
  requires is_text<S>
  static void what(json& f, const S* /*v*/, rule::topic t) {
    f["type"] = "str";
    f["min_length"] = t.empty_ok ? 0 : 1;
    f["max_length"] = codec::max_topic_length;
    f["pattern"] = t.empty_ok ? "^[\\x21-\\x7e]{0,256}$" : "^[\\x21-\\x7e]{1,256}$";
  }
  static void what(json& f, const rlbus::role* /*v*/) {
    f["type"] = "str";
    f["enum"] = {"collector", "learner", "coordinator", "bus"};
  }
  static void what(json& f, const rlbus::role* /*v*/, rule::kind /*r*/) {
    f["type"] = "str";
    f["enum"] = {"collector", "learner"};
  }
  static void what(json& f, const codec::capacity_change* /*v*/) {
    f["type"] = "str";
    f["enum"] = {"increase", "decrease", "snapshot"};
  }
  static void what(json& f, const codec::capacity_change* /*v*/, rule::no_snapshot /*r*/) {
    f["type"] = "str";
    f["enum"] = {"increase", "decrease"};
  }
  static void what(json& f, const bool* /*v*/) { f["type"] = "bool"; }
  template <class U>
  requires std::is_integral_v<U>
  static void what(json& f, const U* /*v*/, rule::range g) {
    f["type"] = "uint";
    f["min"] = g.lo;
    f["max"] = g.hi;
    // The member holds every value the rule allows.
    INFO("field " << f["name"] << ": range up to " << g.hi);
    CHECK(g.hi <= std::numeric_limits<U>::max());
  }
  static void what(json& f, const rlbus::resources* /*v*/) {
    f = {{"name", f["name"]},      {"type", "map<str,number>"},
         {"required", false},  // always written; an absent field reads as the empty map
         {"always_encoded", true}, {"max_entries", codec::max_resources},
         {"key_min_length", 1},    {"key_max_length", codec::max_resource_name},
         {"value_min", 0},         {"value_finite", true}};
  }
  template <class A>
  requires std::is_same_v<A, codec::item_array> ||
      std::is_same_v<A, std::span<const std::string_view>>
  static void what(json& f, const A* /*v*/, rule::items it) {
    f["type"] = "data-items";
    f["verbatim"] = true;
    f["min_items"] = 1;
    f["max_items"] = it.max;
    f["item_fields"] = describe<codec::data_item>();
  }
};

// The fields of T's table, in order, as messages.json would list them.
template <class T>
json describe() {
  json out = json::array();
  const T value{};
  T::fields(value, describer{out});
  return out;
}

json names_of(const json& fields) {
  json out = json::array();
  for (const auto& f : fields) out.push_back(f.at("name"));
  return out;
}

// A table (C++) and its model (messages.json) list the same fields, in the same order,
// each with the same type, required-ness and bounds. `from` (where a relayed value comes
// from) is checked by the caller.
void same_fields(const std::string& what, const json& cpp, json model) {
  INFO(what);
  REQUIRE(model.is_array());
  CHECK(names_of(cpp).dump() == names_of(model).dump());
  for (auto& f : model) f.erase("from");
  for (std::size_t i = 0; i < std::min(cpp.size(), model.size()); ++i) {
    INFO("field " << i + 1 << " '" << model[i].value("name", "") << "'");
    CHECK(cpp[i].dump() == model[i].dump());
  }
}

template <class Variant, std::size_t... I>
void for_each_alternative(Variant* /*v*/, std::index_sequence<I...> /*i*/, auto&& f) {
  (f(static_cast<std::variant_alternative_t<I, Variant>*>(nullptr)), ...);
}

// The C++ table of every ROUTER message, by its name.
std::map<std::string, std::pair<int, json>> cpp_messages() {
  std::map<std::string, std::pair<int, json>> out;
  for_each_alternative(static_cast<codec::message*>(nullptr),
                       std::make_index_sequence<std::variant_size_v<codec::message>>{},
                       [&](auto* tag) {
                         using T = std::remove_pointer_t<decltype(tag)>;
                         const auto id = static_cast<int>(codec::type_of(T{}));
                         const auto name = codec::type_name(static_cast<std::uint8_t>(id));
                         REQUIRE(name);
                         out[std::string(*name)] = {id, describe<T>()};
                       });
  return out;
}

json event_body_fields(std::string_view topic) {
  json out = json::array();
  std::visit(
      [&](const auto& b) {
        using B = std::decay_t<decltype(b)>;
        if constexpr (!std::is_same_v<B, std::monostate>) out = describe<B>();
      },
      codec::event_body_of(topic));
  return out;
}

}  // namespace

TEST_CASE("messages.json and the C++ field table of every message agree", "[protocol][model]") {
  const auto model = load_model();
  const auto cpp = cpp_messages();
  std::set<std::string> modelled;
  for (const auto& m : model.at("messages")) {
    const auto name = m.at("name").get<std::string>();
    if (m.value("transport", "") == "pub") continue;  // EVENT: the events below
    modelled.insert(name);
    INFO("message " << name);
    const auto it = cpp.find(name);
    REQUIRE(it != cpp.end());
    CHECK(it->second.first == m.at("id").get<int>());
    same_fields(name, it->second.second, m.at("fields"));
    // The frames it travels in (§17.1.1), and whether it is one of the bus's (§17).
    const auto id = static_cast<std::uint8_t>(m.at("id").get<int>());
    CHECK(codec::has_payload_frame(id) == m.value("payload_frame", false));
    CHECK(codec::is_bus_type(id) == (m.value("section", "").rfind("17.", 0) == 0));
  }
  std::set<std::string> in_cpp;
  for (const auto& [name, t] : cpp) in_cpp.insert(name);
  CHECK(in_cpp == modelled);
}

TEST_CASE("messages.json and the C++ tables of every event body agree", "[protocol][model]") {
  const auto model = load_model();
  // The envelope every event has.
  json envelope = json::array();
  const codec::event e{};
  codec::event::fields(e, describer{envelope});
  same_fields("event envelope", envelope, model.at("event_envelope"));
  for (const auto& e : model.at("events")) {
    std::vector<std::string> topics;
    if (e.contains("topics"))
      topics = e.at("topics").get<std::vector<std::string>>();
    else if (e.contains("topic_prefix"))
      topics = {e.at("topic_prefix").get<std::string>() + "some-id.some-event"};
    else
      topics = {e.at("topic").get<std::string>()};
    for (const auto& topic : topics) {
      INFO("topic " << topic);
      CHECK_FALSE(event_body_fields(topic).empty());
      same_fields("event " + topic, event_body_fields(topic), e.at("fields"));
    }
  }
  // A topic messages.json does not name has no body this build knows.
  CHECK(event_body_fields("no.such.topic").empty());
}

TEST_CASE("messages.json and the TASK_EVENT bodies the broker composes agree",
          "[protocol][model]") {
  const auto model = load_model();
  const auto cpp = cpp_messages();
  const auto& bodies = model.at("task_event_bodies").at("events");
  json names = json::array();
  std::size_t i = 0;
  std::apply(
      [&](auto... tag) {
        (
            [&](auto body) {
              using B = decltype(body);
              const std::string event(B::event);
              names.push_back(event);
              INFO("task event " << event);
              REQUIRE(i < bodies.size());
              const auto& m = bodies[i++];
              CHECK(m.at("event").get<std::string>() == event);
              if constexpr (codec::event_body::is_verbatim<B>) {
                // The body is a field of the worker's message, as it came: one that is a map.
                const auto from = std::string(*codec::type_name(static_cast<std::uint8_t>(
                                      codec::type_of(typename B::from{})))) +
                                  "." + std::string(B::field);
                CHECK(m.value("verbatim", "") == from);
                const auto fields = describe<typename B::from>();
                bool found = false;
                for (const auto& f : fields)
                  if (f.at("name") == B::field) {
                    found = true;
                    CHECK(f.at("type") == "msgpack-map");
                  }
                CHECK(found);
              } else {
                CHECK_FALSE(m.contains("verbatim"));
                same_fields("task event " + event, describe<B>(), m.at("fields"));
                // A value relayed from a worker's message names a field that message has.
                for (const auto& f : m.at("fields")) {
                  if (!f.contains("from")) continue;
                  const auto from = f.at("from").get<std::string>();
                  const auto dot = from.find('.');
                  const auto it = cpp.find(from.substr(0, dot));
                  REQUIRE(it != cpp.end());
                  CHECK(names_of(it->second.second).dump().find('"' + from.substr(dot + 1) + '"') !=
                        std::string::npos);
                }
              }
            }(tag),
            ...);
      },
      codec::event_body::all{});
  CHECK(i == bodies.size());
  // And the task.* events name the same events, in the same order.
  for (const auto& e : model.at("events"))
    if (e.value("topic_prefix", "") == "task.") CHECK(e.at("event_names").dump() == names.dump());
}
