#!/usr/bin/python3
"""Writes the web view's files into a C++ source, so the broker serves them from its binary.

usage: embed.py OUT.cpp NAME=PATH...

Each NAME is the path the page asks for under /assets/ (index.html is the page itself); its
bytes become an array, its type comes from its extension. Run by meson at build time; the
charting library comes from a Debian package (libjs-chart.js), never from the network.
"""
import sys

TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
}


def main(argv):
    if len(argv) < 3 or any("=" not in a for a in argv[2:]):
        sys.exit(__doc__)
    out = [
        "// Written by src/broker/ops/web/embed.py from the web view's files: do not edit.",
        '#include "broker/ops/web_assets.hpp"',
        "",
        "namespace rlbus::broker {",
        "namespace {",
    ]
    table = []
    for i, arg in enumerate(argv[2:]):
        name, path = arg.split("=", 1)
        kind = next((t for ext, t in TYPES.items() if name.endswith(ext)), None)
        if kind is None:
            sys.exit(f"embed.py: {name}: no content type for its extension")
        with open(path, "rb") as f:
            data = f.read()
        out.append(f"const unsigned char asset_{i}[] = {{")
        for at in range(0, len(data), 24):
            out.append("  " + ",".join(str(b) for b in data[at:at + 24]) + ",")
        out.append("};")
        table.append(f'    {{"{name}", "{kind}", {{reinterpret_cast<const char*>(asset_{i}), '
                     f"{len(data)}}}}},")
    out += [
        "}  // namespace",
        "",
        "const web_asset* find_web_asset(std::string_view name) {",
        "  static const web_asset all[] = {",
        *table,
        "  };",
        "  for (const auto& a : all)",
        "    if (a.name == name) return &a;",
        "  return nullptr;",
        "}",
        "",
        "}  // namespace rlbus::broker",
        "",
    ]
    with open(argv[1], "w", encoding="utf-8") as f:
        f.write("\n".join(out))


if __name__ == "__main__":
    main(sys.argv)
