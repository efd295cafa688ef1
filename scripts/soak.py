#!/usr/bin/env python3
"""Soak test ("Reliability under faults"): 20 epochs of the MNIST MLP with 4 loader workers and a
checkpoint every epoch, watching the trainer's resident memory, its file descriptors and its
device memory, and (with --dashboard) a `lockstep dashboard --follow` window on the run's
metrics log under Xvfb.

    cargo build -p lockstep --bin lockstep
    python3 scripts/soak.py                      # defaults: target/debug/lockstep, ../shared/data/mnist
    python3 scripts/soak.py --bin target/release/lockstep --no-dashboard --out /tmp/soak

Every --interval seconds (0.5) it reads VmRSS, Threads and the number of /proc/PID/fd entries of
the trainer (and of any child process it has: the loader's workers are threads, so normally
none) and of the dashboard; an extra sample is taken the moment the trainer prints
`epoch N: ...` on stderr (an epoch's end, before its checkpoint is written). The metrics log's
`device` events give the device's own counters (for `cpu:0` they count the CPU backend's tensor
memory, which lives in host memory and so is also inside the RSS).

Checks (exit 1 naming the failed one, 0 when all hold), epochs counted from 0 as the log does:
  - the trainer's RSS in the last epoch within MAX_GROWTH (5%) of its RSS in epoch 2, each
    epoch's RSS being the median of its samples (its training plateau: at the instant an epoch
    ends, RSS swings by about 10% with validation's buffers, freed or not yet);
  - the device's reserved and allocated memory (metrics log, at the epoch ends) likewise;
  - the trainer's fds in the last epoch no more than in epoch 2, an epoch's count being its most
    common one (the checkpoint being written opens one more for a moment);
  - with the dashboard: it is still running when the trainer ends, and its RSS never reaches
    DASHBOARD_RSS_BOUND_MIB.
It also prints the epoch-end RSS, the slope of the epoch medians (MiB per epoch) and thread
counts, for a leak too slow to cross 5% in 20 epochs.

Writes to --out (default target/soak/): samples.csv (every sample), epochs.csv (the epoch-end
table), trainer.log / dashboard.log (their stderr), and soak.png (RSS and fds over time with
the epoch ends marked) when matplotlib imports (it is needed for nothing else).
Exit 2 when the run itself could not be made (missing binary or data, the trainer failed).
"""
import argparse
import csv
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Allowed growth of the trainer's RSS (epoch medians) and of the device's memory counters from
# epoch 2 to the last epoch: the "growth < 5%".
MAX_GROWTH = 0.05
# The dashboard's resident memory must stay under this for the whole run. Measured 2026-11-26
# (glow renderer, Mesa's software OpenGL under Xvfb, 1280x820 window, following this 20-epoch log):
# 139-142 MiB once the window is up, 144-147 MiB from epoch 1 to the end, 147.4 MiB at most
# (two runs; it grows by about 0.07 MiB an epoch, the run's history it keeps to draw).
# The bound is about 2x that steady value: room for another Mesa or font cache, while a window
# that kept a copy of the log per repaint, or a texture per frame, crosses it within the run.
DASHBOARD_RSS_BOUND_MIB = 300
# The epoch whose end is the baseline ("flat after epoch 2").
BASE_EPOCH = 2
EPOCH_LINE = re.compile(r"^epoch (\d+):")


def repo_path(p):
    """A path given relative: relative to the repository root, so the script runs from anywhere."""
    return p if os.path.isabs(p) else os.path.normpath(os.path.join(ROOT, p))


def read_status(pid):
    """(VmRSS in KiB, Threads) of a live process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    rss = threads = 0
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return rss, threads


def count_fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None


def descendants(pid):
    """Child processes (any depth) of pid, from /proc/PID/task/*/children."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except FileNotFoundError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except (FileNotFoundError, ProcessLookupError):
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


class Sampler:
    """Samples of one process (and its children), appended under a lock."""

    def __init__(self, name, pid, t0):
        self.name, self.pid, self.t0 = name, pid, t0
        self.rows = []  # (t, rss_kib, fds, threads, processes, kind, epoch)
        self.lock = threading.Lock()
        self.max_children = 0

    def sample(self, kind="periodic", epoch=""):
        t = time.monotonic() - self.t0
        st = read_status(self.pid)
        fds = count_fds(self.pid)
        if st is None or fds is None:
            return None
        rss, threads = st
        kids = descendants(self.pid)
        for k in kids:
            kst, kfd = read_status(k), count_fds(k)
            if kst is not None:
                rss += kst[0]
                threads += kst[1]
            if kfd is not None:
                fds += kfd
        row = (t, rss, fds, threads, 1 + len(kids), kind, epoch)
        with self.lock:
            self.rows.append(row)
            self.max_children = max(self.max_children, len(kids))
        return row


def start_xvfb(tmp):
    """Xvfb on a free display (it writes the number it picked to fd 1), as app/tests/dashboard.rs
    does; -noreset so a client connecting as another leaves finds a server. (proc, ':N')."""
    log = open(os.path.join(tmp, "xvfb.log"), "w")
    proc = subprocess.Popen(
        ["Xvfb", "-displayfd", "1", "-screen", "0", "1280x860x24", "-nolisten", "tcp", "-noreset"],
        stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline().strip()
    if not line.isdigit():
        proc.kill()
        raise RuntimeError(f"Xvfb reported {line!r} instead of a display number")
    # Keep proc.stdout open: a later write by Xvfb to a closed pipe would kill it (SIGPIPE).
    return proc, ":" + line


def stop(proc, timeout=10):
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def metrics_log(path):
    """Epoch, device and checkpoint events of the JSONL log (a cut-off last line is skipped)."""
    import json
    epochs, devices, checkpoints = {}, [], 0
    if not os.path.exists(path):
        return epochs, devices, checkpoints
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            ev = r.get("event")
            if ev == "epoch":
                epochs[r["epoch"]] = r
            elif ev == "device":
                devices.append(r)
            elif ev == "checkpoint":
                checkpoints += 1
    return epochs, devices, checkpoints


def mib(kib):
    return kib / 1024.0


def growth(a, b):
    return (b - a) / a if a else float("inf") if b else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/debug/lockstep",
                    help="the lockstep binary (relative paths: to the repository root)")
    ap.add_argument("--data", default="../shared/data/mnist", help="MNIST's directory")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    ap.add_argument("--out", default="target/soak", help="where the CSVs, logs and plot go")
    dash = ap.add_mutually_exclusive_group()
    dash.add_argument("--dashboard", dest="dashboard", action="store_true", default=None,
                      help="follow the log with `lockstep dashboard` under Xvfb (default: when Xvfb is installed)")
    dash.add_argument("--no-dashboard", dest="dashboard", action="store_false")
    ap.add_argument("--keep", action="store_true", help="keep the temporary checkpoint directory and log")
    # Hidden: to see the checks fail (e.g. --max-growth 0.0001) or to try other bounds.
    ap.add_argument("--max-growth", type=float, default=MAX_GROWTH, help=argparse.SUPPRESS)
    ap.add_argument("--dashboard-bound-mib", type=float, default=DASHBOARD_RSS_BOUND_MIB, help=argparse.SUPPRESS)
    a = ap.parse_args()

    binary, data, out = repo_path(a.bin), repo_path(a.data), repo_path(a.out)
    if not os.access(binary, os.X_OK):
        print(f"soak: no lockstep binary at {binary} (cargo build -p lockstep --bin lockstep, or --bin)", file=sys.stderr)
        return 2
    if not os.path.isdir(data):
        print(f"soak: no MNIST directory at {data} (--data)", file=sys.stderr)
        return 2
    if a.epochs <= BASE_EPOCH + 1:
        print(f"soak: --epochs must be above {BASE_EPOCH + 1} to compare against the end of epoch {BASE_EPOCH}", file=sys.stderr)
        return 2
    if a.dashboard is None:
        a.dashboard = shutil.which("Xvfb") is not None
        if not a.dashboard:
            print("soak: Xvfb not found: running without the dashboard (--dashboard to insist)", file=sys.stderr)
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="lockstep-soak-")
    ckpt, log = os.path.join(tmp, "ckpt"), os.path.join(tmp, "metrics.jsonl")

    xvfb = dashboard = None
    dash_sampler = None
    dash_log = open(os.path.join(out, "dashboard.log"), "w") if a.dashboard else None
    t0 = time.monotonic()
    try:
        if a.dashboard:
            try:
                xvfb, display = start_xvfb(tmp)
            except (OSError, RuntimeError) as e:
                print(f"soak: cannot start Xvfb: {e}", file=sys.stderr)
                return 2
            runtime = os.path.join(tmp, "xdg-runtime")
            os.makedirs(runtime, mode=0o700)
            env = dict(os.environ, DISPLAY=display, LOCKSTEP_RENDERER="glow", LIBGL_ALWAYS_SOFTWARE="1",
                       XDG_RUNTIME_DIR=runtime)
            env.pop("WAYLAND_DISPLAY", None)
            # Started before the trainer: a log that does not exist yet is waited for.
            dashboard = subprocess.Popen([binary, "dashboard", "--follow", log], env=env,
                                         stdout=dash_log, stderr=subprocess.STDOUT)
            dash_sampler = Sampler("dashboard", dashboard.pid, t0)
            time.sleep(2.0)  # let the window come up before training competes for the cores
            if dashboard.poll() is not None:
                print(f"soak: the dashboard exited at once ({dashboard.returncode}); see {dash_log.name}", file=sys.stderr)
                return 2
            print(f"soak: dashboard pid {dashboard.pid} on Xvfb {display}", file=sys.stderr)

        cmd = [binary, "train", "--data", data, "--headless", "--epochs", str(a.epochs), "--workers",
               str(a.workers), "--checkpoint-dir", ckpt, "--metrics-out", log]
        print("soak: " + " ".join(cmd), file=sys.stderr)
        trainer_log = open(os.path.join(out, "trainer.log"), "w")
        trainer = subprocess.Popen(cmd, stdout=trainer_log, stderr=subprocess.PIPE, text=True, bufsize=1)
        tr = Sampler("trainer", trainer.pid, t0)
        epoch_ends = {}  # epoch -> trainer's epoch-end row
        dash_at_epoch = {}

        def read_stderr():
            for line in trainer.stderr:
                trainer_log.write(line)
                trainer_log.flush()
                m = EPOCH_LINE.match(line)
                if m:
                    e = int(m.group(1))
                    row = tr.sample("epoch_end", e)
                    if row is not None:
                        epoch_ends[e] = row
                    if dash_sampler is not None:
                        drow = dash_sampler.sample("epoch_end", e)
                        if drow is not None:
                            dash_at_epoch[e] = drow
                    sys.stderr.write(line)

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        while trainer.poll() is None:
            tr.sample()
            if dash_sampler is not None:
                dash_sampler.sample()
            time.sleep(a.interval)
        reader.join(10)
        trainer_log.close()
        if trainer.returncode != 0:
            print(f"soak: the trainer failed (exit {trainer.returncode}); see {trainer_log.name}", file=sys.stderr)
            return 2
        dash_alive = None
        if dashboard is not None:
            # The dashboard reads the run's last lines, then is stopped.
            for _ in range(int(3.0 / a.interval)):
                dash_sampler.sample()
                time.sleep(a.interval)
            dash_alive = dashboard.poll() is None
    finally:
        stop(dashboard)
        stop(xvfb)
        if dash_log:
            dash_log.close()

    epochs_log, devices, checkpoints = metrics_log(log)
    if not a.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"soak: kept {tmp}", file=sys.stderr)

    # Device memory at each epoch end: the last device event at or before the epoch event.
    dev_at_epoch = {}
    for e, rec in epochs_log.items():
        before = [d for d in devices if d["t"] <= rec["t"]]
        if before:
            dev_at_epoch[e] = before[-1]
    device_names = sorted({d["device"] for d in devices})

    with open(os.path.join(out, "samples.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["process", "t_s", "rss_kib", "fds", "threads", "processes", "kind", "epoch"])
        for s in [tr] + ([dash_sampler] if dash_sampler else []):
            for row in sorted(s.rows):
                w.writerow([s.name, f"{row[0]:.3f}"] + list(row[1:]))

    last = a.epochs - 1
    missing = [e for e in range(a.epochs) if e not in epoch_ends]
    if missing:
        print(f"soak: no epoch-end sample for epochs {missing} (no `epoch N:` line seen)", file=sys.stderr)
        return 2

    # Each epoch's samples: from the previous epoch's end (or the start) to its own end. RSS at the
    # instant of an epoch's end swings by 10% with validation's buffers (freed or not yet), and
    # the fd count there by the checkpoint being written; an epoch's median RSS (its training
    # plateau) and its most common fd count are what a leak would move.
    windows, prev = {}, float("-inf")
    for e in range(a.epochs):
        t_end = epoch_ends[e][0]
        windows[e] = [r for r in tr.rows if prev < r[0] <= t_end]
        prev = t_end
    med_rss = {e: statistics.median(r[1] for r in windows[e]) for e in windows}
    max_rss = {e: max(r[1] for r in windows[e]) for e in windows}
    mode_fds = {e: max(statistics.multimode(r[2] for r in windows[e])) for e in windows}
    max_fds = {e: max(r[2] for r in windows[e]) for e in windows}

    table = []
    for e in range(a.epochs):
        t, rss, fds, threads = epoch_ends[e][:4]
        d = dev_at_epoch.get(e)
        drow = dash_at_epoch.get(e)
        table.append({
            "epoch": e, "t_s": round(t, 2), "trainer_rss_end_mib": round(mib(rss), 1),
            "trainer_rss_median_mib": round(mib(med_rss[e]), 1), "trainer_rss_max_mib": round(mib(max_rss[e]), 1),
            "trainer_fds": mode_fds[e], "trainer_fds_max": max_fds[e], "trainer_threads_end": threads,
            "samples": len(windows[e]),
            "device_allocated_mib": round(d["memory_allocated"] / 2**20, 2) if d else "",
            "device_reserved_mib": round(d["memory_reserved"] / 2**20, 2) if d else "",
            "dashboard_rss_mib": round(mib(drow[1]), 1) if drow else "",
            "dashboard_fds": drow[2] if drow else "",
        })
    with open(os.path.join(out, "epochs.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table)

    print()
    print("trainer RSS: at the epoch's end / the median and the highest of the epoch's samples; fds: the "
          "epoch's most common count / its highest")
    print(f"{'epoch':>5} {'t s':>6} {'RSS end':>8} {'RSS med':>8} {'RSS max':>8} {'fds':>7} {'dev alloc':>9} "
          f"{'dev resv':>8} {'dash RSS':>8} {'dash fds':>8}   (MiB)")
    for r in table:
        print(f"{r['epoch']:>5} {r['t_s']:>6.1f} {r['trainer_rss_end_mib']:>8.1f} {r['trainer_rss_median_mib']:>8.1f} "
              f"{r['trainer_rss_max_mib']:>8.1f} {str(r['trainer_fds']) + '/' + str(r['trainer_fds_max']):>7} "
              f"{str(r['device_allocated_mib']):>9} {str(r['device_reserved_mib']):>8} "
              f"{str(r['dashboard_rss_mib']):>8} {str(r['dashboard_fds']):>8}")
    print()

    failures = []
    base, end = epoch_ends[BASE_EPOCH], epoch_ends[last]
    after = [r for r in tr.rows if r[0] > base[0]]
    g = growth(med_rss[BASE_EPOCH], med_rss[last])
    g_end = growth(base[1], end[1])
    # Least-squares slope of the epochs' medians from the baseline on: a slow leak shows here first.
    xs = list(range(BASE_EPOCH, a.epochs))
    ys = [mib(med_rss[e]) for e in xs]
    xm, ym = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - xm) * (y - ym) for x, y in zip(xs, ys)) / sum((x - xm) ** 2 for x in xs)
    print(f"trainer RSS (epoch median): {mib(med_rss[BASE_EPOCH]):.1f} MiB in epoch {BASE_EPOCH}, "
          f"{mib(med_rss[last]):.1f} MiB in epoch {last}: {100 * g:+.2f}% (bound {100 * a.max_growth:.1f}%); "
          f"slope over epochs {BASE_EPOCH}-{last}: {slope:+.3f} MiB/epoch")
    print(f"trainer RSS at the epoch ends: {mib(base[1]):.1f} -> {mib(end[1]):.1f} MiB ({100 * g_end:+.2f}%); "
          f"highest sample after epoch {BASE_EPOCH}: {mib(max(r[1] for r in after)):.1f} MiB "
          f"(up to its end: {mib(max(r[1] for r in tr.rows if r[0] <= base[0])):.1f} MiB)")
    if g >= a.max_growth:
        failures.append(f"trainer RSS grew {100 * g:.2f}% from epoch {BASE_EPOCH} to epoch {last} (epoch medians "
                        f"{mib(med_rss[BASE_EPOCH]):.1f} -> {mib(med_rss[last]):.1f} MiB), bound {100 * a.max_growth:.1f}%")
    print(f"trainer fds (epoch's most common count): {mode_fds[BASE_EPOCH]} in epoch {BASE_EPOCH}, {mode_fds[last]} "
          f"in epoch {last}; highest after epoch {BASE_EPOCH}: {max(r[2] for r in after)}; threads at the epoch "
          f"ends {base[3]} -> {end[3]}, highest {max(r[3] for r in tr.rows)}; child processes seen: "
          f"{tr.max_children} (the loader's workers are threads)")
    if mode_fds[last] > mode_fds[BASE_EPOCH]:
        failures.append(f"trainer fds grew from {mode_fds[BASE_EPOCH]} (epoch {BASE_EPOCH}) to {mode_fds[last]} "
                        f"(epoch {last})")
    if dev_at_epoch.get(BASE_EPOCH) and dev_at_epoch.get(last):
        db, de = dev_at_epoch[BASE_EPOCH], dev_at_epoch[last]
        for key in ("memory_allocated", "memory_reserved"):
            gd = growth(db[key], de[key])
            print(f"device {db['device']} {key}: {db[key] / 2**20:.2f} -> {de[key] / 2**20:.2f} MiB "
                  f"({100 * gd:+.2f}%; peak {de['memory_peak'] / 2**20:.2f} MiB)")
            if gd >= a.max_growth:
                failures.append(f"device {db['device']} {key} grew {100 * gd:.2f}% from the end of epoch "
                                f"{BASE_EPOCH} to the end of epoch {last}")
        if all(n.startswith("cpu") for n in device_names):
            print("  (the CPU backend's device memory is host memory: these bytes are also inside the RSS above)")
    else:
        print("device memory: the metrics log has no device events; the CPU backend's device memory is host "
              "memory, covered by the RSS above")
    print(f"checkpoint events in the log: {checkpoints} over {len(epochs_log)} epochs")
    if len(epochs_log) != a.epochs:
        failures.append(f"the metrics log holds {len(epochs_log)} epoch events, not {a.epochs}")
    if dash_sampler is not None:
        rows = dash_sampler.rows
        if not rows:
            failures.append("no sample of the dashboard (it died at once?)")
        else:
            dpeak = max(r[1] for r in rows)
            dbase = dash_at_epoch.get(BASE_EPOCH)
            dend = rows[-1]
            if dbase:
                print(f"dashboard RSS growth from the end of epoch {BASE_EPOCH} to after the run: "
                      f"{100 * growth(dbase[1], dend[1]):+.2f}% (not checked: the bound below is)")
            print(f"dashboard RSS: {mib(dbase[1]) if dbase else float('nan'):.1f} MiB at the end of epoch "
                  f"{BASE_EPOCH}, {mib(dend[1]):.1f} MiB after the run, peak {mib(dpeak):.1f} MiB "
                  f"(bound {a.dashboard_bound_mib:.0f} MiB); fds {dbase[2] if dbase else '?'} -> {dend[2]}")
            if mib(dpeak) >= a.dashboard_bound_mib:
                failures.append(f"dashboard RSS reached {mib(dpeak):.1f} MiB, bound {a.dashboard_bound_mib:.0f} MiB")
            if not dash_alive:
                failures.append("the dashboard was no longer running when the trainer ended; see dashboard.log")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        plt = None
        print(f"matplotlib is not installed: no plot (samples in {out}/samples.csv)")
    if plt is not None:
        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
        for s, colour in [(tr, "tab:blue")] + ([(dash_sampler, "tab:orange")] if dash_sampler else []):
            rows = sorted(s.rows)
            ts = [r[0] for r in rows]
            ax1.plot(ts, [mib(r[1]) for r in rows], color=colour, lw=1.2, label=f"{s.name} RSS")
            ax2.plot(ts, [r[2] for r in rows], color=colour, lw=1.2, label=f"{s.name} fds")
        ends = [(e, epoch_ends[e][0]) for e in range(a.epochs)]
        if dev_at_epoch:
            ax1.plot([epoch_ends[e][0] for e in sorted(dev_at_epoch)],
                     [dev_at_epoch[e]["memory_reserved"] / 2**20 for e in sorted(dev_at_epoch)],
                     "g.-", lw=1, label="cpu:0 reserved (in RSS)")
        for ax in (ax1, ax2):
            for e, t in ends:
                if e == BASE_EPOCH:
                    ax.axvline(t, color="black", lw=1.0)
                else:
                    ax.axvline(t, color="grey", lw=0.5, alpha=0.6, ls="--")
            ax.grid(alpha=0.3)
            ax.legend(loc="center right", fontsize=8)
        ax1.set_ylabel("MiB")
        ax1.set_ylim(bottom=0)
        ax2.set_ylabel("open file descriptors")
        ax2.set_ylim(bottom=0)
        ax2.set_xlabel("seconds (dashed: epoch ends; solid: end of epoch 2, the baseline)")
        ax1.set_title(f"Soak: {a.epochs} epochs of the MNIST MLP, {a.workers} workers, a checkpoint every epoch")
        fig.tight_layout()
        png = os.path.join(out, "soak.png")
        fig.savefig(png, dpi=80)
        print(f"plot: {png}")
    print(f"samples: {out}/samples.csv, {out}/epochs.csv")

    if failures:
        for f in failures:
            print(f"SOAK FAILED: {f}", file=sys.stderr)
        return 1
    print("soak: all checks hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
