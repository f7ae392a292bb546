// Every setting of the broker in one table: its key in the config file, its flag, its
// environment variable, what it means, its bounds, whether it may change at run time and
// where it lives in `config`. The flags,
// the config file, the environment, --print-config and the reference page are all made from
// this table, so none of them can name a setting the others do not know.
//
// Where a value comes from, strongest first: a flag, the environment (RLBUS_BROKER_...), the
// config file (--config), the default.
#pragma once

#include <cstdint>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "broker/core/config.hpp"

namespace rlbus::broker {

struct setting {
  std::string_view section;  // its table in the config file ("" : the top level)
  std::string_view name;     // its key in that table, and its flag (--NAME) unless flag_name
  std::string_view help;
  using field = std::variant<std::string config::*, std::uint32_t config::*, std::size_t config::*,
                             bool config::*, fsync_policy config::*>;
  field where;
  std::uint64_t min = 0, max = 0;       // numbers: the range a value must lie in; text: min 1
                                        // means it must not be empty
  std::vector<std::string_view> words;  // text: the values allowed (empty: any)
  std::string_view unit;                // of a number, for people ("ms", "bytes", ...)
  std::string_view flag_name;           // when the flag is not --NAME (--log-level)
  bool live = false;  // may change while the broker runs (OPS set, rlbus-ctl set; SPEC §16.5):
                      // the broker reads it afresh at each use

  /// "section.name" (or just the name at the top level): how people and rlbus-ctl name it.
  [[nodiscard]] std::string key() const;
  [[nodiscard]] std::string flag() const;  // --name (or --flag_name)
  [[nodiscard]] std::string env() const;   // RLBUS_BROKER_ + the flag's name, upper case,
                                           // dashes as underscores
  /// The value in `cfg`, as text (what a flag takes).
  [[nodiscard]] std::string text(const config& cfg) const;
  /// Sets the value from text (a flag, the environment): why it cannot be, or "" when set.
  std::string assign(config& cfg, std::string_view text) const;
  /// Why the value in `cfg` is not one this setting may have ("" when it is).
  [[nodiscard]] std::string check(const config& cfg) const;
};

/// Throws std::invalid_argument naming the first setting of `cfg` out of its range (the table's
/// bounds), or the first rule between settings it breaks.
void validate(const config& cfg);

/// Every setting, in the order of the reference page.
const std::vector<setting>& settings();
/// The settings whose value in `cfg` is not their default: key and value as text, in table
/// order.
std::vector<std::pair<std::string, std::string>> changed_settings(const config& cfg);
/// The keys of the settings that may change while the broker runs (`live`), in table order.
std::vector<std::string> live_setting_keys();
/// The setting with this key ("tasks.max-queue"), name in its table or flag name ("max-queue",
/// "log-level"); nullptr if none.
const setting* find_setting(std::string_view key_or_name);

/// A config file that cannot be used: the message names the file, the key, the value and why.
class config_file_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Reads the TOML file at `path` into `cfg`, except the settings whose keys are in `keep`
/// (given as flags or in the environment: they win). Returns the keys the file set. An
/// unreadable or malformed file, an unknown key, a value of the wrong type or out of range
/// throws config_file_error; `cfg` may then be half set.
std::set<std::string> load_config_file(const std::string& path, config& cfg,
                                       const std::set<std::string>& keep);

/// The configuration as a TOML document of every setting, one table per section, each
/// value with its meaning as a comment: what --print-config prints, a valid config file.
std::string to_toml(const config& cfg);

/// The reference page of every setting (Markdown): key, flag, environment variable, default
/// and meaning. docs/configuration.md is this text, checked by a test.
std::string reference_markdown();

}  // namespace rlbus::broker
