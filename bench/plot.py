#!/usr/bin/python3
"""Draws PNG plots of an rlbus-bench JSON report (bench/results/latest.json by default):

  latency_median.png  median task step latency per variant: rlbus / proxy / direct / http
  latency_p99.png     the same for p99
  throughput.png      events/s (rlbus) and steps/s (http) against the number of collectors

Scale rows (`rlbus-bench scale`) are left out: they are read from the table.
Both latency plots and the throughput plot use a log scale: the HTTP baseline sits orders of
magnitude away from the others. Uses gnuplot (Debian: apt-get install gnuplot-nox), else
matplotlib (apt-get install python3-matplotlib); says so and exits 3 when neither is there.

  usage: bench/plot.py [REPORT.json] [OUT_DIR]     (default OUT_DIR: bench/results/plots)
"""

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys

SERIES = ("rlbus", "proxy", "direct", "http")


def median_of(row, name):
    s = row.get(name)
    return s["median"] if isinstance(s, dict) and s.get("median") is not None else None


def latency_table(report, metric):
    """[(label, {series: value})] for the latency rows with this metric."""
    out = []
    for row in report["rows"]:
        if row["scenario"] == "latency" and row["metric"] == metric:
            label = row["variant"].replace("step ", "")
            out.append((label, {k: median_of(row, k) for k in SERIES}))
    return out


def throughput_table(report):
    """{line name: [(collectors, value)]}: rlbus per client, the baselines once."""
    lines = {}
    for row in report["rows"]:
        if row["scenario"] != "throughput" or row["metric"] != "events/s":
            continue
        n = row["params"]["collectors"]
        client = row["params"].get("client", "wire")
        lines.setdefault("rlbus " + client, []).append((n, median_of(row, "rlbus")))
        if client == "wire":  # the baselines are the same measurements on both rows
            for k, title in (("proxy", "zmq proxy"), ("direct", "zmq direct"),
                             ("http", "http (steps/s)")):
                lines.setdefault(title, []).append((n, median_of(row, k)))
    return {k: sorted(v) for k, v in lines.items() if any(x is not None for _, x in v)}


def log_range(values):
    vals = [v for v in values if v is not None and v > 0]
    if not vals:
        return 1, 10
    return 10 ** math.floor(math.log10(min(vals))), 10 ** math.ceil(math.log10(max(vals)) + 0.3)


def title_of(report):
    pinned = report.get("pinned")
    return "rlbus-bench %s, git %s, %s, load %s -> %s" % (
        report.get("date", "?"), report.get("git_commit", "?"),
        "pinned to CPU " + pinned if pinned else "unpinned",
        report["machine"].get("load_before", "?"), report["machine"].get("load_after", "?"))


# --- gnuplot ---------------------------------------------------------------------------------


def gp_quote(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def gnuplot_latency(report, metric, png, work):
    rows = latency_table(report, metric)
    if not rows:
        return False
    present = [k for k in SERIES if any(v[k] is not None for _, v in rows)]
    data = os.path.join(work, os.path.basename(png) + ".dat")
    with open(data, "w") as f:
        for label, v in rows:
            f.write(gp_quote(label) + " " +
                    " ".join("?" if v[k] is None else repr(v[k]) for k in present) + "\n")
    lo, hi = log_range([v[k] for _, v in rows for k in present])
    plots = ", ".join("%s using %d:xtic(1) title %s" % (gp_quote(data) if i == 0 else "''", i + 2,
                                                        gp_quote(k))
                      for i, k in enumerate(present))
    return """
set output {out}
set title {title} font ",9"
set ylabel "task step latency, {metric} (log scale)"
set logscale y
set yrange [{lo}:{hi}]
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set datafile missing "?"
set xtics rotate by -20
set key top left
set grid ytics
plot {plots}
unset logscale y
unset xtics
set xtics
""".format(out=gp_quote(png), title=gp_quote(title_of(report)), metric=metric, lo=lo, hi=hi,
           plots=plots)


def gnuplot_throughput(report, png, work):
    lines = throughput_table(report)
    if not lines:
        return False
    parts = []
    for i, (name, pts) in enumerate(lines.items()):
        data = os.path.join(work, "tp%d.dat" % i)
        with open(data, "w") as f:
            for n, v in pts:
                f.write("%d %s\n" % (n, "?" if v is None else repr(v)))
        parts.append("%s using 1:2 with linespoints lw 2 title %s" % (gp_quote(data),
                                                                       gp_quote(name)))
    lo, hi = log_range([v for pts in lines.values() for _, v in pts])
    ns = sorted({n for pts in lines.values() for n, _ in pts})
    return """
set output {out}
set title {title} font ",9"
set xlabel "collectors (http: concurrent coordinator threads)"
set ylabel "events/s (http: task steps/s), log scale"
set logscale x 2
set logscale y
set xrange [{xlo}:{xhi}]
set yrange [{lo}:{hi}]
set xtics ({xt})
set datafile missing "?"
set key outside right
set grid
plot {plots}
""".format(out=gp_quote(png), title=gp_quote(title_of(report)), lo=lo, hi=hi,
           xlo=max(0.5, ns[0] / 1.5), xhi=ns[-1] * 1.5,
           xt=", ".join("%s %d" % (gp_quote(str(n)), n) for n in ns), plots=", ".join(parts))


def with_gnuplot(report, out_dir):
    work = os.path.join(out_dir, ".gnuplot")
    os.makedirs(work, exist_ok=True)
    # pngcairo where the build has it (gnuplot-nox does), else the plain png terminal.
    terms = subprocess.run(["gnuplot", "-e", "set terminal"], capture_output=True, text=True)
    term = "pngcairo" if "pngcairo" in terms.stdout + terms.stderr else "png"
    script = ["set terminal %s size 1000,600 noenhanced" % term]
    made = []
    for metric, name in (("median us", "latency_median.png"), ("p99 us", "latency_p99.png")):
        part = gnuplot_latency(report, metric, os.path.join(out_dir, name), work)
        if part:
            script.append(part)
            made.append(name)
    part = gnuplot_throughput(report, os.path.join(out_dir, "throughput.png"), work)
    if part:
        script.append("reset")  # keeps the terminal
        script.append(part)
        made.append("throughput.png")
    r = subprocess.run(["gnuplot"], input="\n".join(script), text=True, capture_output=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise RuntimeError("gnuplot failed")
    shutil.rmtree(work, ignore_errors=True)
    return made


# --- matplotlib --------------------------------------------------------------------------------


def with_matplotlib(report, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    made = []
    for metric, name in (("median us", "latency_median.png"), ("p99 us", "latency_p99.png")):
        rows = latency_table(report, metric)
        if not rows:
            continue
        present = [k for k in SERIES if any(v[k] is not None for _, v in rows)]
        fig, ax = plt.subplots(figsize=(10, 6))
        width = 0.8 / len(present)
        for i, k in enumerate(present):
            xs = [j + i * width for j, (_, v) in enumerate(rows) if v[k] is not None]
            ys = [v[k] for _, v in rows if v[k] is not None]
            ax.bar(xs, ys, width, label=k)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))])
        ax.set_xticklabels([label for label, _ in rows], rotation=-20)
        ax.set_yscale("log")
        ax.set_ylabel("task step latency, %s (log scale)" % metric)
        ax.set_title(title_of(report), fontsize=9)
        ax.legend()
        ax.grid(axis="y", which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name))
        plt.close(fig)
        made.append(name)
    lines = throughput_table(report)
    if lines:
        fig, ax = plt.subplots(figsize=(10, 6))
        for name, pts in lines.items():
            ax.plot([n for n, v in pts if v is not None], [v for _, v in pts if v is not None],
                    marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("collectors (http: concurrent coordinator threads)")
        ax.set_ylabel("events/s (http: task steps/s), log scale")
        ax.set_title(title_of(report), fontsize=9)
        ax.legend()
        ax.grid(which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "throughput.png"))
        plt.close(fig)
        made.append("throughput.png")
    return made


def main():
    if len(sys.argv) > 3 or (len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help")):
        print(__doc__)
        return 2
    path = sys.argv[1] if len(sys.argv) > 1 else "bench/results/latest.json"
    out_dir = sys.argv[2] if len(sys.argv) > 2 else "bench/results/plots"
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        print("plot.py: cannot read %s: %s" % (path, e), file=sys.stderr)
        return 1
    os.makedirs(out_dir, exist_ok=True)
    if shutil.which("gnuplot"):
        made, tool = with_gnuplot(report, out_dir), "gnuplot"
    else:
        if importlib.util.find_spec("matplotlib") is None:
            print("plot.py: neither gnuplot nor matplotlib is installed; install one of them:\n"
                  "  apt-get install gnuplot-nox      (or: apt-get install python3-matplotlib)",
                  file=sys.stderr)
            return 3
        made, tool = with_matplotlib(report, out_dir), "matplotlib"
    if not made:
        # Scale rows (rlbus-bench scale) are table-only: a handful of numbers per worker count.
        print("plot.py: %s has no latency or throughput rows to draw (scale rows are not "
              "plotted)" % path, file=sys.stderr)
        return 1
    print("plot.py: drew %s in %s (%s)" % (", ".join(made), out_dir, tool), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
