#!/usr/bin/env python3
"""Exactly-once output against at-least-once output (issue 15's benchmark row), on the real
broker: the local runner (lambda-streams, in-process, release build) with
`--output-guarantee exactly_once` (a transaction per source partition of each batch, design
notes section 5a) and with `--output-guarantee at_least_once` (idempotent producer), beside
Kafka Streams (bench/kstreams) with `exactly_once_v2` and `at_least_once`; the same input
topic, broker and machine, alternating runs.

Run through `bench/run --eos [ARGS]` (which builds both sides first), or directly:

    bench/eos.py --runner target/eos/local-runner --jar bench/kstreams/target/kstreams-bench.jar \
        [--records 200000] [--keys 10000] [--runs 2] [--batch-sizes 1000,10000] [--out bench/results/eos]

Two topologies, as in bench/e2e.py: `stateless` (filter + map → to) and `count` (count by
key → to_stream → to). lambda-streams keeps its state in memory here (the output's cost is
what is compared; DynamoDB's is measured by bench/e2e.py and bench/run --cost). Per run:
throughput (records/s from the first record received to the last batch done, as bench/e2e.py
measures it) and, for lambda-streams, the function's time per batch (p50/p99 over the
run's invocations, from the runner's summary). Kafka Streams has no batches: its number is
throughput (its exactly_once_v2 commits a transaction every commit.interval.ms = 100 ms).
Every run is verified by bench/kstreams' Verify (read_committed): exactly the expected
output records, and every key's final count. Writes OUT.json and OUT.md; the machine's load
average is recorded before and after every run.

Stdlib only (and bench/e2e.py's helpers).
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e  # noqa: E402  (the helpers of the end-to-end benchmark: admin, java, input, load)

MODES = ["stateless", "count"]


def info(msg):
    print(f"bench/eos: {msg}", file=sys.stderr, flush=True)


def contenders(batch_sizes):
    """(name, side, guarantee, batch size) per contender of a mode."""
    out = [("kstreams-alos", "kstreams", "at_least_once", None),
           ("kstreams-eosv2", "kstreams", "exactly_once_v2", None)]
    for b in batch_sizes:
        out.append((f"lambda-streams-alo-b{b}", "lambda-streams", "at_least_once", b))
        out.append((f"lambda-streams-eos-b{b}", "lambda-streams", "exactly_once", b))
    return out


def run_one(a, mode, contender, index, input_topic, stamp):
    name, side, guarantee, batch = contender
    run_id = f"bench-eos-{stamp}-{mode}-{name}-{index}"
    output = f"{run_id}-out"
    e2e.admin(a.jar, "create", output, e2e.PARTITIONS)
    state_dir = os.path.join(a.state_root, run_id)
    env = dict(os.environ)
    if side == "kstreams":
        cmd = ["java", *a.jvm_opts.split(), "-jar", a.jar, e2e.BOOTSTRAP, f"{run_id}-app", input_topic,
               output, mode, guarantee, str(a.records), state_dir]
    else:
        # A fresh application id per run: its transactional ids and shadow group (which
        # holds the committed progress per input partition) are the run's own.
        cmd = [a.runner, "run", "--function", f"bench-{mode}", "--state", "memory",
               "--guarantee", "exactly_once", "--output-guarantee", guarantee,
               "--application-id", f"{run_id}-app", "--group-id", f"{run_id}-group",
               "--batch-size", str(batch), "--until-caught-up", "--quiet"]
        env.update({"BENCH_INPUT_TOPIC": input_topic, "BENCH_OUTPUT_TOPIC": output, "RUST_LOG": "warn"})
    load_before = e2e.loadavg()
    broker_before = e2e.cpu_seconds(a.broker_pid)
    t0 = time.monotonic()
    p = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, env=env, timeout=a.timeout)
    wall = time.monotonic() - t0
    load_after = e2e.loadavg()
    broker_after = e2e.cpu_seconds(a.broker_pid)
    tv = e2e.time_v(p.stderr)
    r = {"mode": mode, "contender": name, "side": side, "guarantee": guarantee, "batch_size": batch,
         "run": index, "run_id": run_id, "wall_s": wall, "loadavg_before": load_before,
         "loadavg_after": load_after, "cpu_s": (tv["user_s"] or 0) + (tv["sys_s"] or 0), **tv,
         "broker_cpu_s": None if broker_after is None else broker_after - broker_before}
    if p.returncode != 0:
        tail = "\n".join(p.stderr.strip().splitlines()[-30:])
        raise SystemExit(f"error: {run_id} exited with {p.returncode}:\n{tail}")
    if side == "kstreams":
        ks = json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][-1])
        r["records"], r["active_s"], r["kstreams"] = ks["records"], ks["seconds"], ks
    else:
        m = re.search(r"processed (\d+) records in (\d+) batches .*\(([\d.]+) s from the first record\)", p.stdout)
        lat = re.search(r"invocation time per batch: p50 ([\d.]+) ms, p99 ([\d.]+) ms, max ([\d.]+) ms "
                        r"over (\d+) successful invocations", p.stdout)
        if not m or not lat:
            raise SystemExit(f"error: no summary lines from the runner:\n{p.stdout}\n{p.stderr[-2000:]}")
        r["records"], r["batches"], r["active_s"] = int(m.group(1)), int(m.group(2)), float(m.group(3))
        r["batch_p50_ms"], r["batch_p99_ms"], r["batch_max_ms"] = map(float, lat.groups()[:3])
        r["records_per_batch"] = r["records"] / max(r["batches"], 1)
    r["records_per_s"] = r["records"] / r["active_s"]
    rc, verdict, err = e2e.java(a.jar, "Verify", e2e.BOOTSTRAP, output, mode, a.records, a.keys, timeout=1200)
    r["verify"] = verdict
    e2e.admin(a.jar, "delete-prefix", f"{run_id}-")
    shutil.rmtree(state_dir, ignore_errors=True)
    if rc != 0 or not verdict or not verdict.get("ok"):
        raise SystemExit(f"error: WRONG OUTPUT in {run_id}: {verdict or err.strip()[-2000:]}")
    if r["records"] != a.records:
        raise SystemExit(f"error: {run_id} processed {r['records']} records, expected {a.records}")
    latency = (f", per batch p50 {r['batch_p50_ms']:.1f} ms p99 {r['batch_p99_ms']:.1f} ms "
               f"({r['records_per_batch']:,.0f} records/batch)") if side != "kstreams" else ""
    info(f"{mode:9} {name:28} run {index}: {r['records_per_s']:>10,.0f} records/s ({r['active_s']:.2f} s active)"
         f"{latency}, CPU {r['cpu_s']:.2f} s, load {load_before} -> {load_after}; verified")
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runner", required=True)
    ap.add_argument("--jar", required=True)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--batch-sizes", default="1000,10000")
    ap.add_argument("--jvm-opts", default="-Xmx1g")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--state-root", default=None)
    ap.add_argument("--out", default="bench/results/eos")
    a = ap.parse_args()
    a.runner, a.jar = os.path.abspath(a.runner), os.path.abspath(a.jar)
    a.state_root = os.path.abspath(a.state_root or os.path.join(os.path.dirname(a.jar), "tmp"))
    batch_sizes = [int(b) for b in a.batch_sizes.split(",") if b]
    a.broker_pid = e2e.find_pid("kafka.Kafka ")
    stamp = datetime.datetime.now().strftime("%H%M%S")
    input_topic = f"bench-e2e-input-{a.records}-{a.keys}"
    produced = e2e.ensure_input(a.jar, input_topic, a.records, a.keys)
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    load_start = e2e.loadavg()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    plan = [(mode, c) for mode in MODES for c in contenders(batch_sizes)]
    results = []
    for index in range(a.runs):
        shift = index % len(plan)
        for mode, c in plan[shift:] + plan[:shift]:
            results.append(run_one(a, mode, c, index, input_topic, stamp))

    med = {}
    for mode, c in plan:
        rs = [r for r in results if r["mode"] == mode and r["contender"] == c[0]]
        m = {"mode": mode, "contender": c[0], "side": c[1], "guarantee": c[2], "batch_size": c[3],
             "runs": len(rs), "records_per_s": statistics.median(r["records_per_s"] for r in rs),
             "cpu_s": statistics.median(r["cpu_s"] for r in rs),
             "loads": [f"{r['loadavg_before'].split()[0]}→{r['loadavg_after'].split()[0]}" for r in rs]}
        if c[1] != "kstreams":
            for k in ("batch_p50_ms", "batch_p99_ms", "records_per_batch"):
                m[k] = statistics.median(r[k] for r in rs)
        med[(mode, c[0])] = m
    ratios = []
    for mode in MODES:
        for b in batch_sizes:
            eos, alo = med[(mode, f"lambda-streams-eos-b{b}")], med[(mode, f"lambda-streams-alo-b{b}")]
            ratios.append({"mode": mode, "side": "lambda-streams", "batch_size": b,
                           "throughput_eos_over_alo": eos["records_per_s"] / alo["records_per_s"],
                           "p50_eos_over_alo": eos["batch_p50_ms"] / alo["batch_p50_ms"],
                           "p99_eos_over_alo": eos["batch_p99_ms"] / alo["batch_p99_ms"]})
        eos, alo = med[(mode, "kstreams-eosv2")], med[(mode, "kstreams-alos")]
        ratios.append({"mode": mode, "side": "kstreams", "batch_size": None,
                       "throughput_eos_over_alo": eos["records_per_s"] / alo["records_per_s"]})
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), None)
    broker_version, streams_version = e2e.pinned_versions()
    doc = {
        "benchmark": "exactly-once output vs at-least-once output, lambda-streams beside Kafka Streams (issue 15)",
        "date": date,
        "machine": {"nproc": os.cpu_count(), "cpu": cpu, "kernel": platform.release(), "uptime_start": uptime,
                    "loadavg_start": load_start, "loadavg_end": e2e.loadavg()},
        "versions": {"kafka_broker": broker_version, "kafka_streams": streams_version},
        "setup": {"records": a.records, "keys": a.keys, "partitions": e2e.PARTITIONS, "input_topic": input_topic,
                  "input_produced_now": produced, "runs": a.runs, "batch_sizes": batch_sizes,
                  "lambda_streams_state": "memory", "jvm_opts": a.jvm_opts, "kstreams_threads": 2},
        "medians": list(med.values()),
        "ratios": ratios,
        "runs": results,
    }
    with open(a.out + ".json", "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    lines = [
        f"{a.records:,} records, {a.keys:,} keys, {e2e.PARTITIONS} partitions; {a.runs} run(s) per contender, "
        f"alternating; medians. lambda-streams: local runner (release), state in memory. "
        f"{os.cpu_count()} cores ({cpu}); `uptime` at the start: {uptime}; load average {e2e.loadavg()} at the end; {date}.",
        "",
        "| mode | contender | output guarantee | batch size | records/batch | records/s | batch p50 ms | batch p99 ms | CPU s | load before → after (per run) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for m in med.values():
        dash = lambda k, f: f.format(m[k]) if k in m else "-"  # noqa: E731
        lines.append(f"| {m['mode']} | {m['contender']} | {m['guarantee']} | {m['batch_size'] or '-'} | "
                     f"{dash('records_per_batch', '{:,.0f}')} | {m['records_per_s']:,.0f} | "
                     f"{dash('batch_p50_ms', '{:.1f}')} | {dash('batch_p99_ms', '{:.1f}')} | {m['cpu_s']:.2f} | "
                     f"{'; '.join(m['loads'])} |")
    lines += ["", "Exactly-once over at-least-once (medians): throughput < 1 is the cost in records/s; "
              "per-batch latency > 1 is the cost per batch.", "",
              "| mode | side | batch size | throughput EOS/ALO | batch p50 EOS/ALO | batch p99 EOS/ALO |",
              "|---|---|---:|---:|---:|---:|"]
    for r in ratios:
        p50 = f"{r['p50_eos_over_alo']:.2f}x" if "p50_eos_over_alo" in r else "-"
        p99 = f"{r['p99_eos_over_alo']:.2f}x" if "p99_eos_over_alo" in r else "-"
        lines.append(f"| {r['mode']} | {r['side']} | {r['batch_size'] or '-'} | "
                     f"{r['throughput_eos_over_alo']:.2f}x | {p50} | {p99} |")
    md = "\n".join(lines) + "\n"
    with open(a.out + ".md", "w") as f:
        f.write(md)
    print(md)
    info(f"wrote {a.out}.json and {a.out}.md")


if __name__ == "__main__":
    main()
