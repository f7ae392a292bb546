#!/usr/bin/python3
"""Writes the C++ message model from messages.json: gen_cpp.py MESSAGES_JSON OUT_HPP; with
--defaults first, the SDK's public rlbus/defaults.hpp instead (the model's `defaults`).

The output (codec/model.hpp in the build tree) holds everything the wire's list decides: the
header's constants, the type ids and their names, the error codes and their names, the decode
limits, one struct per message (its members, its defaults and its `fields()` table, which the
codec's one writer and one reader walk), the data item of DATA_BATCH, the PUB event topics and
bodies, the bodies of TASK_EVENT (as views: see view_member), and the rules that tie fields of
a message together. A field added to messages.json is
in the C++ codec at the next build.

How a field of the model becomes a member and a rule (codec/rules.hpp says what each rule
checks):

- uint: std::uint8_t or std::uint16_t when its range is that type's whole range, otherwise
  std::uint32_t or std::uint64_t, the smallest that holds its maximum; rule::range{min, max}.
  With a `default` it is a flag (rule::flag: absent reads as the default).
- bool: bool; with a `default`, a flag.
- str: a peer id (the id pattern) is rule::id, a topic rule::topic, an enum of the four roles
  rlbus::role, of the two worker kinds rlbus::role with rule::kind, of the capacity changes
  codec::capacity_change (rule::no_snapshot without "snapshot"), any other enum a string with
  rule::words; the rest rule::text{max_length, min_length}.
- bin: std::string with rule::bin; msgpack-map / msgpack-any: the value's exact bytes (blob)
  with rule::shape (relayed_map, batched_map by their nesting bound); map<str,number>:
  rlbus::resources; data-items: item_array of data_item, itself made from `item_fields`.
- An optional field without a default is a std::optional; a required one, or one that is
  always encoded, is the plain type. A member's default is the smallest value its rules allow
  (or the field's `default`), so that a default-made message is a valid one.

Names: a member is named like its field, but for a field named like its struct (INFO's
`info`), which is `body`. A message's struct and type id are its name in lower case, unless the message says
otherwise in `cpp_name` (its struct; the type id keeps the lower-case name). Event bodies are
named by their entry's `cpp_name`, topics by the topic with '.' as '_'.
"""

import json
import sys

ID_PATTERN = "^[A-Za-z0-9._:@/-]{1,128}$"
TOPIC_PATTERNS = {"^[\\x21-\\x7e]{1,256}$": False, "^[\\x21-\\x7e]{0,256}$": True}
ROLES = ["collector", "learner", "coordinator", "bus"]
KINDS = ["collector", "learner"]
CHANGES = ["increase", "decrease", "snapshot"]
U64_MAX = (1 << 64) - 1
NESTING_SHAPES = {14: "relayed_map", 12: "batched_map"}


class ModelError(Exception):
    pass


def cpp_uint(lo, hi):
    if (lo, hi) == (0, 0xFF):
        return "std::uint8_t"
    if (lo, hi) == (0, 0xFFFF):
        return "std::uint16_t"
    if hi <= 0xFFFF_FFFF:
        return "std::uint32_t"
    if hi <= U64_MAX:
        return "std::uint64_t"
    raise ModelError(f"range up to {hi} does not fit 64 bits")


def cpp_number(n):
    if n == U64_MAX:
        return "~std::uint64_t{0}"
    if n == 1 << 63:
        return "std::uint64_t{1} << 63U"
    return str(n) if n < 100000 else f"{n}U"


def quoted(s):
    return json.dumps(s)


class Words:
    """The enums that stay strings, named once each (the first field that lists them)."""

    def __init__(self):
        self.arrays = []  # (name, values)

    def name_for(self, owner, field, values):
        for name, v in self.arrays:
            if v == values:
                return name
        name = f"{owner}_{field}_words"
        self.arrays.append((name, values))
        return name


def member(owner, f, words):
    """(C++ type, default initialiser or None, rule arguments) of one field."""
    name, typ = f["name"], f["type"]
    has_default = "default" in f
    optional = not f["required"] and not has_default and not f.get("always_encoded", False)
    rules = []
    init = None
    if typ == "uint":
        lo, hi = f["min"], f["max"]
        ctype = cpp_uint(lo, hi)
        rules.append(f"rule::range{{{cpp_number(lo)}, {cpp_number(hi)}}}")
        value = f["default"] if has_default else lo
        init = cpp_number(value)
        if has_default:
            rules.append("rule::flag{}")
    elif typ == "bool":
        ctype = "bool"
        if has_default:
            if f["default"] is not False:
                raise ModelError(f"{owner}.{name}: a flag's default is false")
            rules.append("rule::flag{}")
        init = "false"
    elif typ == "str":
        ctype = "std::string"
        enum = f.get("enum")
        pattern = f.get("pattern")
        if enum == ROLES:
            ctype, init = "rlbus::role", "rlbus::role::collector"
        elif enum == KINDS:
            ctype, init = "rlbus::role", "rlbus::role::collector"
            rules.append("rule::kind{}")
        elif enum in (CHANGES, CHANGES[:2]):
            ctype, init = "capacity_change", "capacity_change::increase"
            if enum == CHANGES[:2]:
                rules.append("rule::no_snapshot{}")
        elif enum is not None:
            rules.append(f"rule::words{{{words.name_for(owner, name, enum)}}}")
            init = quoted(enum[0])
        elif pattern == ID_PATTERN:
            rules.append("rule::id{}")
        elif pattern in TOPIC_PATTERNS:
            rules.append(f"rule::topic{{{'true' if TOPIC_PATTERNS[pattern] else ''}}}")
        elif pattern is not None:
            raise ModelError(f"{owner}.{name}: no C++ rule for the pattern {pattern}")
        else:
            lo = f.get("min_length", 0)
            rules.append(f"rule::text{{{f['max_length']}{f', {lo}' if lo else ''}}}")
    elif typ == "bin":
        ctype = "std::string"
        rules.append(f"rule::bin{{{f['max_length'] if 'max_length' in f else '~std::size_t{0}'}}}")
    elif typ in ("msgpack-map", "msgpack-any"):
        ctype = "blob"
        if typ == "msgpack-any":
            shape, init = "any", "nil_blob"
        else:
            shape, init = NESTING_SHAPES.get(f.get("max_nesting"), "map"), "empty_map_blob"
            if "max_nesting" in f and f["max_nesting"] not in NESTING_SHAPES:
                raise ModelError(f"{owner}.{name}: no C++ shape nests at most {f['max_nesting']}")
        rules.append(f"rule::shape::{shape}")
    elif typ == "map<str,number>":
        ctype = "rlbus::resources"
    elif typ == "data-items":
        ctype = "item_array"
        rules.append(f"rule::items{{{f['max_items']}}}")
    else:
        raise ModelError(f"{owner}.{name}: unknown type {typ}")
    if optional:
        ctype, init = f"std::optional<{ctype}>", None
    return ctype, init, rules


def members(out, owner, fields, words):
    """Appends the members of `owner` for `fields`; returns their lines of its fields()."""
    calls = []
    for f in fields:
        ctype, init, rules = member(owner, f, words)
        # A member may not be named like its class (INFO's `info`): that one is `body`.
        mname = "body" if f["name"] == owner else f["name"]
        out.append(f"  {ctype} {mname}{'' if init is None else ' = ' + init};")
        args = "".join(", " + r for r in rules)
        calls.append(f"    f({quoted(f['name'])}, s.{mname}{args});")
    return calls


def fields_function(out, calls):
    """A struct's `fields()`, which walks its members in order: `calls`, the lines of members()."""
    out.append("  template <class S, class F>")
    if calls:
        out.append("  static void fields(S& s, F&& f) {")
        out.extend(calls)
        out.append("  }")
    else:
        out.append("  static void fields(S& /*s*/, F&& /*f*/) {}")


def struct(out, name, fields, words, doc, type_id=None, check=None):
    out.append(f"/// {doc}")
    out.append(f"struct {name} {{")
    calls = members(out, name, fields, words)
    if type_id is not None:
        out.append(f"  static constexpr msg_type type = msg_type::{type_id};")
    out.append(f"  bool operator==(const {name}&) const = default;")
    fields_function(out, calls)
    if check:
        out.extend(check)
    out.append("};")
    out.append("")


def check_rules(name, m):
    """The rules that tie fields together (`exactly_one`, `together`), as a static check()."""
    body = []

    def has(n):
        return f"m.{n}.has_value()"

    def exactly_one(group):
        if len(group) != 2:
            raise ModelError(f"{m['name']}: exactly_one of two fields is all the C++ codec knows")
        text = "exactly one of " + " and ".join(f"'{n}'" for n in group)
        body.append(f"    if ({has(group[0])} == {has(group[1])}) return {quoted(text)};")

    if "exactly_one" in m:
        exactly_one(m["exactly_one"])
    if "together" in m:
        singles = [n for n in m["together"] if isinstance(n, str)]
        groups = [g for g in m["together"] if not isinstance(g, str)]
        every = singles + [n for g in groups for n in g]
        text = (" and ".join(f"'{n}'" for n in singles) + " come together, with " +
                " or ".join(" or ".join(f"'{n}'" for n in g) for g in groups))
        body.append(f"    if ({' && '.join('!' + has(n) for n in every)}) return std::nullopt;")
        body.append(f"    if ({' || '.join('!' + has(n) for n in singles)}) return {quoted(text)};")
        for g in groups:
            exactly_one(g)
    if not body:
        return None
    return (["  /// The rules that tie its fields together; nullopt when they hold.",
             f"  static std::optional<std::string_view> check(const {name}& m) {{"] + body +
            ["    return std::nullopt;", "  }"])


def view_member(owner, f):
    """(C++ type, default initialiser or None, rule arguments) of a field of a TASK_EVENT body:
    the broker writes the body at once into the event's bytes, so a string, a bin and a map are
    views into the message the event reports, and the items of a batch a span of views."""
    typ, name = f["type"], f["name"]
    optional = not f["required"]
    init = None
    if typ == "uint":
        ctype, _, rules = member(owner, f, None)
        init = None if optional else cpp_number(f["min"])
        ctype = ctype.removeprefix("std::optional<").removesuffix(">")
    elif typ == "str" and "enum" not in f and "pattern" not in f:
        ctype, rules = "std::string_view", [f"rule::text{{{f['max_length']}}}"]
    elif typ == "bin":
        ctype, rules = "std::string_view", ["rule::bin{~std::size_t{0}}"]
    elif typ == "msgpack-map":
        ctype, init, rules = "std::string_view", "empty_map_blob", ["rule::shape::map"]
    elif typ == "data-items":
        ctype, rules = "std::span<const std::string_view>", [f"rule::items{{{f['max_items']}}}"]
    else:
        raise ModelError(f"task event {owner}.{name}: no view of a {typ}")
    if optional:
        ctype, init = f"std::optional<{ctype}>", None
    return ctype, init, rules


def task_event_bodies(model, struct_of):
    """namespace event_body: one struct per TASK_EVENT body (§12.5.6), in the model's order."""
    te = model["task_event_bodies"]
    out = [f"/// The bodies of TASK_EVENT (§{te['section']}), by event: the maps the broker composes,",
           "/// each listing its fields in `fields()` (written by codec::append_fields), and the",
           "/// events whose body is a field of the worker's message, byte for byte (`from`, `field`).",
           "namespace event_body {", ""]
    names = []
    for e in te["events"]:
        name = e["event"]
        names.append(name)
        out.append(f"/// {name}: {e['note']}.")
        out.append(f"struct {name} {{")
        out.append(f"  static constexpr std::string_view event = {quoted(name)};")
        if "verbatim" in e:
            msg, field = e["verbatim"].split(".")
            if msg not in struct_of:
                raise ModelError(f"task event {name}: no message {msg}")
            out.append(f"  using from = codec::{struct_of[msg]};")
            out.append(f"  static constexpr std::string_view field = {quoted(field)};")
            out.append("};")
            out.append("")
            continue
        calls = []
        for f in e["fields"]:
            ctype, init, rules = view_member(name, f)
            out.append(f"  {ctype} {f['name']}{'' if init is None else ' = ' + init};")
            calls.append(f"    f({quoted(f['name'])}, s.{f['name']}{''.join(', ' + r for r in rules)});")
        fields_function(out, calls)
        out.append("};")
        out.append("")
    out.append("/// Every event of a task, in the order of the model.")
    out.append(f"using all = std::tuple<{', '.join(names)}>;")
    out.append("")
    out.append("/// Whether `B` is a body made of a field of the worker's message.")
    out.append("template <class B>")
    out.append("constexpr bool is_verbatim = requires { typename B::from; };")
    out.append("")
    out.append("}  // namespace event_body")
    out.append("")
    return out


# The kinds of message a loop routes apart, each the messages of its reserved ranges (by their
# sections): (predicate, sections, what it says).
ROUTES = [
    ("is_task_type", ("12", "12.9"), "the task messages and stream flow control"),
    ("is_ops_type", ("16",), "the operations messages, OPS and OPS_REPLY"),
    ("is_bus_type", ("17",), "the topic bus's messages"),
    ("is_replication_type", ("14.10",),
     "replication between the brokers of a group, which travels on a leader's replication "
     "endpoint only"),
]


def routes(model, enum_name):
    """The routing predicates (ROUTES) and has_payload_frame, as switches over type ids."""
    ranges = {r["section"]: (r["first"], r["last"]) for r in model["reserved_ranges"]}
    out = []

    def predicate(name, doc, msgs):
        if not msgs:
            raise ModelError(f"{name}: no message")
        out.append(f"/// True for the type ids of {doc}.")
        out.append(f"constexpr bool {name}(std::uint8_t type) noexcept {{")
        out.append("  switch (static_cast<msg_type>(type)) {")
        for m in msgs:
            out.append(f"    case msg_type::{enum_name[m['name']]}:")
        out.append("      return true;")
        out.append("    default:")
        out.append("      return false;")
        out.append("  }")
        out.append("}")
        out.append("")

    for name, sections, doc in ROUTES:
        spans = [ranges[s] for s in sections]
        sec = ", ".join("§" + s for s in sections)
        predicate(name, f"{doc} ({sec})",
                  [m for m in model["messages"] if any(a <= m["id"] <= b for a, b in spans)])
    predicate("has_payload_frame", "the messages that travel with a third frame, the payload",
              [m for m in model["messages"] if m.get("payload_frame")])
    return out


def generate(model):
    out = []
    words = Words()
    h = model["header"]
    msgs = model["messages"]
    router = [m for m in msgs if m.get("transport") != "pub"]
    enum_name = {m["name"]: m["name"].lower() for m in msgs}

    out.append("/// The header frame every message carries (§3.2): signature, version, type.")
    sig = h["signature"]
    out.append(f"inline constexpr std::uint8_t signature_0 = 0x{sig[0]:02X};  // '{chr(sig[0])}'")
    out.append(f"inline constexpr std::uint8_t signature_1 = 0x{sig[1]:02X};  // '{chr(sig[1])}'")
    out.append(f"inline constexpr std::uint8_t protocol_version = {model['version']};")
    out.append(f"inline constexpr std::size_t header_size = {h['size']};")
    out.append("")
    out.append("/// Message type ids.")
    out.append("enum class msg_type : std::uint8_t {")
    for m in sorted(msgs, key=lambda m: m["id"]):
        out.append(f"  {enum_name[m['name']]} = 0x{m['id']:02X},  // §{m['section']}")
    out.append("};")
    out.append("")
    out.append("/// Name of a known type (\"HELLO\", ...), or nullopt for an unassigned id.")
    out.append("constexpr std::optional<std::string_view> type_name(std::uint8_t id) noexcept {")
    out.append("  switch (static_cast<msg_type>(id)) {")
    for m in msgs:
        out.append(f"    case msg_type::{enum_name[m['name']]}:")
        out.append(f"      return {quoted(m['name'])};")
    out.append("  }")
    out.append("  return std::nullopt;")
    out.append("}")
    out.append("")
    out += routes(model, enum_name)
    out.append("/// Error codes carried by ERROR, DISCONNECT and the answers that refuse (§6).")
    out.append("enum class error_code : std::uint16_t {")
    for e in model["error_codes"]:
        out.append(f"  {e['name'].lower()} = {e['code']},")
    out.append("};")
    out.append("")
    out.append("/// Short upper-case name of a code (\"BAD_FRAME\"), \"UNKNOWN\" for anything else.")
    out.append("constexpr std::string_view code_name(std::uint16_t code) noexcept {")
    out.append("  switch (static_cast<error_code>(code)) {")
    for e in model["error_codes"]:
        out.append(f"    case error_code::{e['name'].lower()}:")
        out.append(f"      return {quoted(e['name'])};")
    out.append("  }")
    out.append("  return \"UNKNOWN\";")
    out.append("}")
    out.append("")
    out.append("/// Limits applied to every untrusted msgpack body (§5): they bound what a decode")
    out.append("/// can allocate to a small multiple of the input's size.")
    out.append("struct decode_limits {")
    for k, v in model["limits"].items():
        if k != "max_ext":  # the decoder takes no ext at all
            out.append(f"  std::size_t {k} = {v};")
    out.append("};")
    out.append("")

    body = []
    item_struct_done = False
    for m in router:
        name = m.get("cpp_name", enum_name[m["name"]])
        for f in m["fields"]:
            if f["type"] == "data-items" and not item_struct_done:
                struct(body, "data_item", f["item_fields"], words,
                       f"One item of {m['name']}'s `{f['name']}` (§{m['section']}); not a message.")
                item_struct_done = True
        direction = m["direction"].replace("->", " -> ")
        struct(body, name, m["fields"], words, f"{m['name']} ({direction}, §{m['section']}).",
               type_id=enum_name[m["name"]], check=check_rules(name, m))
    names = [m.get("cpp_name", enum_name[m["name"]]) for m in router]
    body.append("/// Any message that travels on the ROUTER or between the brokers of a group.")
    body.append(f"using message = std::variant<{', '.join(names)}>;")
    body.append("")

    # PUB events: topics, bodies, the envelope.
    body.append("/// Topics of the PUB events (§7); `task.`, `policy.` and `capacity.` prefix more.")
    body.append("namespace topic {")
    for e in model["events"]:
        for t in e.get("topics", [] if "topic_prefix" in e else [e["topic"]]):
            body.append(f"inline constexpr std::string_view {t.replace('.', '_')} = {quoted(t)};")
    body.append("}  // namespace topic")
    body.append("")
    bodies = {}  # cpp_name: (fields, topics), in the order of first use
    for e in model["events"]:
        cname = e.get("cpp_name")
        if cname is None:
            raise ModelError(f"event {e['topic']}: no cpp_name")
        fields, topics = bodies.setdefault(cname, (e["fields"], []))
        if fields != e["fields"]:
            raise ModelError(f"event {e['topic']}: {cname} is made of other fields elsewhere")
        topics.append(e["topic"])
    order = list(bodies)
    for cname, (fields, topics) in bodies.items():
        struct(body, cname, fields, words, f"The body of {', '.join(topics)}.")
    body.append("/// An event as published: the envelope every event has, and its topic's body;")
    body.append("/// a topic this build does not know decodes with std::monostate as its body.")
    body.append("struct event {")
    body.append("  std::string topic;")
    calls = members(body, "event", model["event_envelope"], words)
    body.append(f"  std::variant<std::monostate, {', '.join(order)}> body;")
    body.append("  bool operator==(const event&) const = default;")
    body.append("  /// The envelope's fields, written before the body's.")
    fields_function(body, calls)
    body.append("};")
    body.append("")
    body.append("/// The body an event of `topic` has (std::monostate for a topic not in the model).")
    body.append("inline decltype(event::body) event_body_of(std::string_view name) {")
    for e in model["events"]:
        if "topic_prefix" in e:
            cond = f"name.rfind({quoted(e['topic_prefix'])}, 0) == 0"
        else:
            cond = f"name == topic::{e['topic'].replace('.', '_')}"
        body.append(f"  if ({cond}) return {e['cpp_name']}{{}};")
    body.append("  return std::monostate{};")
    body.append("}")
    body.append("")

    body += task_event_bodies(model, {m["name"]: m.get("cpp_name", enum_name[m["name"]])
                                      for m in router})

    for name, values in words.arrays:
        out.append(f"/// The words `{name[:-len('_words')].replace('_', '.', 1)}` takes.")
        out.append(f"inline constexpr std::array<std::string_view, {len(values)}> {name}{{"
                   + ", ".join(quoted(v) for v in values) + "};")
    out.append("")
    return out + body


def generate_defaults(model):
    """rlbus/defaults.hpp: the model's `defaults`, a `_ms` one as std::chrono::milliseconds."""
    out = [
        "// Generated from protocol/messages.json by protocol/gen_cpp.py at build time: do not edit.",
        "// What the SDK, rlbus-ctl and the broker choose where the protocol leaves the choice to a",
        "// peer: the endpoints a broker binds and a client connects to by default, the heartbeat",
        "// and reconnect backoff a client asks for, the size of the batches and fragments it makes.",
        "#pragma once",
        "",
        "#include <chrono>",
        "#include <cstddef>",
        "#include <string_view>",
        "",
        "namespace rlbus::defaults {",
        "",
    ]
    for key, value in model["defaults"].items():
        if isinstance(value, str):
            out.append(f"inline constexpr std::string_view {key} = {quoted(value)};")
        elif isinstance(value, int) and key.endswith("_ms"):
            out.append(f"inline constexpr std::chrono::milliseconds {key[:-3]}{{{value}}};")
        elif isinstance(value, int) and not isinstance(value, bool):
            out.append(f"inline constexpr std::size_t {key} = {value};")
        else:
            raise ModelError(f"defaults.{key}: a string or a whole number, not {value!r}")
    out += ["", "}  // namespace rlbus::defaults", ""]
    return "\n".join(out)


HEAD = """\
// Generated from protocol/messages.json by protocol/gen_cpp.py at build time: do not edit.
// Everything here is the wire's list in C++: change messages.json and rebuild.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <variant>

#include "codec/rules.hpp"
#include "codec/vocabulary.hpp"

namespace rlbus::codec {

"""

TAIL = "}  // namespace rlbus::codec\n"


def main(argv):
    defaults = len(argv) > 1 and argv[1] == "--defaults"
    if defaults:
        argv = argv[:1] + argv[2:]
    if len(argv) != 3:
        print("usage: gen_cpp.py [--defaults] MESSAGES_JSON OUT_HPP", file=sys.stderr)
        return 2
    try:
        with open(argv[1], encoding="utf-8") as f:
            model = json.load(f)
        if defaults:
            text = generate_defaults(model)
        else:
            text = HEAD + "\n".join(generate(model)) + "\n" + TAIL
    except (OSError, ValueError, KeyError, ModelError) as e:
        print(f"gen_cpp.py: {argv[1]}: {e}", file=sys.stderr)
        return 1
    with open(argv[2], "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
