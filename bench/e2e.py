#!/usr/bin/env python3
"""End to end on the real broker (issue 7, item 2): the local runner (lambda-streams,
in-process) against a Kafka Streams application (bench/kstreams), same broker, same
input topic, same machine, alternating runs.

Run through `bench/run --e2e [ARGS]` (which builds both sides first), or directly:

    bench/e2e.py --runner target/release/local-runner --jar bench/kstreams/target/kstreams-bench.jar \
        [--records 1000000] [--keys 10000] [--runs 3] [--dynamodb-runs N] [--batch-size 10000] [--only NAME,...] \
        [--out bench/results/e2e]

The input topic (8 partitions) is filled once with RECORDS records (bench/kstreams' Produce:
key `key-<i mod KEYS>`, value `"<i>,<amount>"`, amount a hash of i in 0..100) and reused by
later invocations when it already holds exactly that many. Every run gets a fresh output
topic, consumer group / application id, DynamoDB table and state directory (all removed
afterwards), runs under /usr/bin/time -v (CPU user+sys, peak RSS of the process), and is
verified by bench/kstreams' Verify (read_committed): (a) exactly the expected output records,
each well-formed; (b) every key's final count equals its number of input records. A wrong
output stops the benchmark with an error. Writes OUT.json and OUT.md.

Stdlib only; the machine's load average is recorded before and after every run.
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
import urllib.request

BOOTSTRAP = "127.0.0.1:9092"
DYNAMODB = "http://127.0.0.1:8000"
PARTITIONS = 8


class Contender:
    def __init__(self, name, side, guarantee, state=None):
        self.name = name
        self.side = side  # "kstreams" | "lambda-streams"
        self.guarantee = guarantee
        self.state = state  # lambda-streams: "memory" | "dynamodb"


CONTENDERS = {
    "stateless": [
        Contender("kstreams-alos", "kstreams", "at_least_once"),
        Contender("kstreams-eosv2", "kstreams", "exactly_once_v2"),
        # No state: the guarantee setting does not matter; the output is at-least-once
        # (idempotent producer, no transactions), as with Kafka Streams' at_least_once.
        Contender("lambda-streams", "lambda-streams", "at_least_once", "memory"),
    ],
    "count": [
        Contender("kstreams-alos", "kstreams", "at_least_once"),
        Contender("kstreams-eosv2", "kstreams", "exactly_once_v2"),
        Contender("lambda-streams-dynamodb-eo", "lambda-streams", "exactly_once", "dynamodb"),
        Contender("lambda-streams-dynamodb-alo", "lambda-streams", "at_least_once", "dynamodb"),
        Contender("lambda-streams-memory", "lambda-streams", "exactly_once", "memory"),
    ],
}

# (mode, lambda-streams contender, Kafka Streams anchor, what is equal between them)
PAIRS = [
    ("stateless", "lambda-streams", "kstreams-alos", "equal: at-least-once output"),
    ("stateless", "lambda-streams", "kstreams-eosv2", "not equal: Kafka Streams' output is transactional"),
    ("count", "lambda-streams-dynamodb-eo", "kstreams-eosv2",
     "exactly-once state effect on both; Kafka Streams' output is transactional, lambda-streams' is idempotent + versioned"),
    ("count", "lambda-streams-dynamodb-alo", "kstreams-alos", "equal: at-least-once"),
    ("count", "lambda-streams-memory", "kstreams-alos", "in-memory state (not durable) vs RocksDB + changelog"),
    ("count", "lambda-streams-memory", "kstreams-eosv2", "in-memory state (not durable) vs RocksDB + changelog"),
]


def info(msg):
    print(f"bench/e2e: {msg}", file=sys.stderr, flush=True)


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def find_pid(pattern):
    """The pid of a process whose command line contains `pattern` (the shared broker, the
    emulator), or None."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if pattern in f.read().replace(b"\0", b" ").decode(errors="replace"):
                    return int(pid)
        except OSError:
            continue
    return None


def cpu_seconds(pid):
    """User+sys CPU seconds of a process so far (from /proc/PID/stat), or None."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return None


def java(jar, cls, *args, timeout=600):
    p = subprocess.run(["java", "-cp", jar, f"dev.lambdastreams.bench.{cls}", *map(str, args)],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout)
    last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    try:
        out = json.loads(last) if last else None
    except json.JSONDecodeError:
        out = None
    return p.returncode, out, p.stderr


def java_background(jar, cls, *args):
    """Starts one of bench/kstreams' tools without waiting for it (see `java_wait`)."""
    return subprocess.Popen(["java", "-cp", jar, f"dev.lambdastreams.bench.{cls}", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)


def java_wait(p, timeout=600):
    """Waits for a tool `java_background` started: its last JSON line; stops the benchmark
    when it failed."""
    out, err = p.communicate(timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"error: {' '.join(p.args[3:4])} failed: {err.strip()[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


def admin(jar, *args):
    rc, out, err = java(jar, "Admin", BOOTSTRAP, *args)
    if rc != 0:
        raise SystemExit(f"error: Admin {' '.join(map(str, args))} failed: {err.strip()[-2000:]}")
    return out


def set_dynamodb(endpoint):
    """Point every DynamoDB call of this benchmark (table setup, the runner's store) at `endpoint`."""
    global DYNAMODB
    DYNAMODB = endpoint


def dynamodb(target, body):
    """One DynamoDB JSON API call to the emulator (dummy credentials: it checks their shape only)."""
    req = urllib.request.Request(DYNAMODB, data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/x-amz-json-1.0",
        "X-Amz-Target": f"DynamoDB_20120810.{target}",
        "X-Amz-Date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ"),
        "Authorization": "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/dynamodb/aws4_request, "
                         "SignedHeaders=host, Signature=00",
    })
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        return {"error": e.read().decode(errors="replace")}


def time_v(stderr):
    """User+sys seconds, peak RSS (KiB) and exit status from /usr/bin/time -v's report."""
    def grab(label, conv=float):
        m = re.search(rf"^\s*{re.escape(label)}:\s*(.+)$", stderr, re.M)
        return conv(m.group(1).strip()) if m else None
    return {
        "user_s": grab("User time (seconds)"),
        "sys_s": grab("System time (seconds)"),
        "peak_rss_kib": grab("Maximum resident set size (kbytes)", int),
        "exit_status": grab("Exit status", int),
    }


def ensure_input(jar, topic, records, keys):
    have = admin(jar, "records", topic)
    if have["partitions"] == PARTITIONS and have["records"] == records:
        info(f"input topic {topic} already holds {records:,} records in {PARTITIONS} partitions: reused")
        return False
    if have["partitions"]:
        info(f"input topic {topic} holds {have['records']:,} records in {have['partitions']} partitions: recreated")
        admin(jar, "delete-prefix", topic)
        time.sleep(2)
    admin(jar, "create", topic, PARTITIONS)
    info(f"producing {records:,} records ({keys:,} keys) to {topic}")
    t0 = time.monotonic()
    rc, out, err = java(jar, "Produce", BOOTSTRAP, topic, records, keys, timeout=1800)
    if rc != 0:
        raise SystemExit(f"error: producing the input failed: {err.strip()[-2000:]}")
    have = admin(jar, "records", topic)
    if have["records"] != records:
        raise SystemExit(f"error: {topic} holds {have['records']} records after producing {records}")
    info(f"produced in {time.monotonic() - t0:.1f} s")
    return True


def kstreams_cmd(a, run_id, input_topic, output, mode, guarantee, state_dir):
    """The Kafka Streams side (bench/kstreams) of one run."""
    return ["java", *a.jvm_opts.split(), "-jar", a.jar, BOOTSTRAP, f"{run_id}-app", input_topic, output,
            mode, guarantee, str(a.records), state_dir]


def runner_env(input_topic, output, rust_log="warn"):
    """The environment of a local runner run: the bench topologies' topics, and the
    emulator's endpoint with dummy credentials (never the AWS default chain)."""
    env = dict(os.environ)
    env.update({
        "BENCH_INPUT_TOPIC": input_topic,
        "BENCH_OUTPUT_TOPIC": output,
        "RUST_LOG": rust_log,
        "NO_COLOR": "1",
        "AWS_ENDPOINT_URL_DYNAMODB": DYNAMODB,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    })
    return env


def measure(a, run_id, cmd, env):
    """Runs `cmd` under /usr/bin/time -v: wall time, the load average and the shared
    services' CPU (other engineers' tests included: an upper bound of what this run cost
    them) around it, the process's CPU and peak RSS. Stops the benchmark when it fails.
    Returns (the measures, the process's stdout, its stderr)."""
    load_before = loadavg()
    broker_before, emulator_before = cpu_seconds(a.broker_pid), cpu_seconds(a.emulator_pid)
    t0 = time.monotonic()
    p = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, env=env, timeout=a.timeout)
    wall = time.monotonic() - t0
    load_after = loadavg()
    broker_after, emulator_after = cpu_seconds(a.broker_pid), cpu_seconds(a.emulator_pid)
    if p.returncode != 0:
        tail = "\n".join(p.stderr.strip().splitlines()[-30:])
        raise SystemExit(f"error: {run_id} exited with {p.returncode}:\n{tail}")
    tv = time_v(p.stderr)
    return {
        "run_id": run_id, "wall_s": wall, "loadavg_before": load_before, "loadavg_after": load_after,
        "cpu_s": (tv["user_s"] or 0) + (tv["sys_s"] or 0), **tv,
        "broker_cpu_s": None if broker_after is None else broker_after - broker_before,
        "emulator_cpu_s": None if emulator_after is None else emulator_after - emulator_before,
    }, p.stdout, p.stderr


def side_results(side, out):
    """Records, active seconds (and for lambda-streams batches and the latency per batch)
    from a run's stdout: Kafka Streams' JSON line, or the local runner's summary lines."""
    if side == "kstreams":
        ks = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
        return {"records": ks["records"], "active_s": ks["seconds"], "kstreams": ks}
    m = re.search(r"processed (\d+) records in (\d+) batches .*\(([\d.]+) s from the first record\)", out)
    if not m:
        raise SystemExit(f"error: no summary line from the runner:\n{out[-3000:]}")
    r = {"records": int(m.group(1)), "batches": int(m.group(2)), "active_s": float(m.group(3))}
    lat = re.search(r"invocation time per batch: p50 ([\d.]+) ms, p99 ([\d.]+) ms, max ([\d.]+) ms", out)
    if lat:
        r["batch_p50_ms"], r["batch_p99_ms"], r["batch_max_ms"] = map(float, lat.groups())
    r["records_per_batch"] = r["records"] / max(r["batches"], 1)
    return r


def verify_and_clean(a, result, output, mode, records, keys, state_dir=None, table=None, prefix=None):
    """Verifies `output` with bench/kstreams' Verify (read_committed), then removes the run's
    topics (`prefix`, default the run id), state directory and table, before judging: a
    failure leaves nothing behind but its report. Stops the benchmark on a wrong output."""
    rc, verdict, err = java(a.jar, "Verify", BOOTSTRAP, output, mode, records, keys, timeout=1200)
    result["verify"] = verdict
    admin(a.jar, "delete-prefix", f"{prefix or result['run_id']}-")
    if state_dir:
        shutil.rmtree(state_dir, ignore_errors=True)
    if table:
        dynamodb("DeleteTable", {"TableName": table})
    if rc != 0 or not verdict or not verdict.get("ok"):
        raise SystemExit(f"error: WRONG OUTPUT in {result['run_id']}: {verdict or err.strip()[-2000:]}")
    if result["records"] != records:
        raise SystemExit(f"error: {result['run_id']} processed {result['records']} records, expected {records}")


def run_one(a, mode, c, index, input_topic, stamp):
    run_id = f"bench-e2e-{stamp}-{mode}-{c.name}-{index}"
    output = f"{run_id}-out"
    admin(a.jar, "create", output, PARTITIONS)
    state_dir = os.path.join(a.state_root, run_id)
    if c.side == "kstreams":
        cmd, env = kstreams_cmd(a, run_id, input_topic, output, mode, c.guarantee, state_dir), dict(os.environ)
    else:
        cmd = [a.runner, "run", "--function", f"bench-{mode}", "--state", c.state,
               "--guarantee", c.guarantee, "--group-id", f"{run_id}-group", "--batch-size", str(a.batch_size),
               "--until-caught-up", "--quiet", "--table", run_id]
        env = runner_env(input_topic, output)
    measured, out, _ = measure(a, run_id, cmd, env)
    result = {"mode": mode, "contender": c.name, "side": c.side, "guarantee": c.guarantee, "state": c.state,
              "run": index, **measured, **side_results(c.side, out)}
    result["records_per_s"] = result["records"] / result["active_s"]
    result["records_per_s_wall"] = a.records / result["wall_s"]
    verify_and_clean(a, result, output, mode, a.records, a.keys, state_dir,
                     table=run_id if c.state == "dynamodb" else None)
    info(f"{mode:9} {c.name:28} run {index}: {result['records_per_s']:>10,.0f} records/s "
         f"({result['active_s']:.2f} s active, {result['wall_s']:.2f} s wall), CPU {result['cpu_s']:.2f} s, "
         f"peak RSS {result['peak_rss_kib'] / 1024:.0f} MiB, load {result['loadavg_before']} -> "
         f"{result['loadavg_after']}; verified")
    return result


def machine():
    """The machine's cores, CPU model, kernel and `uptime` (its load), for the results."""
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), None)
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return {"nproc": os.cpu_count(), "cpu": cpu, "kernel": platform.release(), "uptime_start": uptime,
            "loadavg_start": loadavg()}


def write_results(out, doc, lines):
    """Writes OUT.json (`doc`) and OUT.md (`lines`), and prints the table."""
    with open(out + ".json", "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    md = "\n".join(lines) + "\n"
    with open(out + ".md", "w") as f:
        f.write(md)
    print(md)
    info(f"wrote {out}.json and {out}.md")


def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(results):
    out = {}
    for r in results:
        out.setdefault((r["mode"], r["contender"]), []).append(r)
    med = {}
    for key, rs in out.items():
        med[key] = {
            "runs": len(rs),
            "records_per_s": statistics.median(r["records_per_s"] for r in rs),
            "active_s": statistics.median(r["active_s"] for r in rs),
            "wall_s": statistics.median(r["wall_s"] for r in rs),
            "records_per_s_wall": statistics.median(r["records_per_s_wall"] for r in rs),
            "cpu_s": statistics.median(r["cpu_s"] for r in rs),
            "peak_rss_mib": statistics.median(r["peak_rss_kib"] for r in rs) / 1024,
            "broker_cpu_s": median_or_none(r["broker_cpu_s"] for r in rs),
            "emulator_cpu_s": median_or_none(r["emulator_cpu_s"] for r in rs),
            "guarantee": rs[0]["guarantee"], "state": rs[0]["state"], "side": rs[0]["side"],
        }
    return med


def fmt(value):
    return "-" if value is None else f"{value:.1f}"


def version(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        return (p.stdout + p.stderr).strip().splitlines()[0]
    except OSError:
        return None


def pinned_versions():
    """The broker version scripts/services runs and the Kafka Streams version bench/kstreams
    builds with, read from the files that pin them (so the results name what really ran)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    broker = streams = None
    with open(os.path.join(root, "scripts", "services")) as f:
        m = re.search(r"^KAFKA_VERSION=(\S+)$", f.read(), re.M)
        broker = m and m.group(1)
    with open(os.path.join(root, "bench", "kstreams", "pom.xml")) as f:
        m = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", f.read())
        streams = m and m.group(1)
    return broker, streams


def common_args(ap, out):
    """The arguments bench/e2e.py and bench/eos.py share."""
    ap.add_argument("--runner", required=True)
    ap.add_argument("--jar", required=True)
    ap.add_argument("--jvm-opts", default="-Xmx1g")
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--state-root", default=None)
    ap.add_argument("--out", default=out)
    ap.add_argument("--dynamodb", default=DYNAMODB,
                    help="the emulator's endpoint (default: the one `scripts/services up` starts, "
                         "dynoxide on a SQLite file); e.g. a second, in-memory dynoxide")


def prepare(a):
    """Absolute paths, the emulator's endpoint, and the shared services' pids (their CPU
    per run is recorded)."""
    set_dynamodb(a.dynamodb)
    a.runner = os.path.abspath(a.runner)
    a.jar = os.path.abspath(a.jar)
    a.state_root = os.path.abspath(a.state_root or os.path.join(os.path.dirname(a.jar), "tmp"))
    a.broker_pid = find_pid("kafka.Kafka ")
    port = a.dynamodb.rsplit(":", 1)[-1].strip("/")
    a.emulator_pid = find_pid(f"--port {port}") or find_pid("dynoxide serve")
    info(f"broker pid {a.broker_pid}, emulator pid {a.emulator_pid} (their CPU per run is recorded)")


def alternating(plan, runs):
    """Every run goes through every contender of `plan`; the order rotates per run.
    Yields (run index, contender)."""
    for index in range(runs):
        shift = index % len(plan)
        for item in plan[shift:] + plan[:shift]:
            yield index, item


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(ap, "bench/results/e2e")
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dynamodb-runs", type=int, default=None,
                    help="runs of the DynamoDB contenders (default: --runs); the emulator writes ~2,000 items/s")
    ap.add_argument("--batch-size", type=int, default=10_000)
    ap.add_argument("--only", default="", help="comma-separated MODE/NAME or NAME filters")
    a = ap.parse_args()
    prepare(a)
    only = [s for s in a.only.split(",") if s]

    def wanted(mode, c):
        return not only or any(o in (c.name, f"{mode}/{c.name}", mode) for o in only)

    stamp = datetime.datetime.now().strftime("%H%M%S")
    input_topic = f"bench-e2e-input-{a.records}-{a.keys}"
    produced = ensure_input(a.jar, input_topic, a.records, a.keys)
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    host = machine()
    plan = [(mode, c) for mode in CONTENDERS for c in CONTENDERS[mode] if wanted(mode, c)]
    results = []
    for index, (mode, c) in alternating(plan, a.runs):
        if c.state == "dynamodb" and a.dynamodb_runs is not None and index >= a.dynamodb_runs:
            continue
        results.append(run_one(a, mode, c, index, input_topic, stamp))
    med = summarize(results)

    ratios = []
    for mode, ls, ks, note in PAIRS:
        if (mode, ls) in med and (mode, ks) in med:
            l, k = med[(mode, ls)], med[(mode, ks)]
            ratios.append({
                "mode": mode, "lambda_streams": ls, "kstreams": ks, "note": note,
                "throughput_ratio": l["records_per_s"] / k["records_per_s"],
                "wall_ratio": k["wall_s"] / l["wall_s"],
                "cpu_ratio": l["cpu_s"] / k["cpu_s"],
                "rss_ratio": l["peak_rss_mib"] / k["peak_rss_mib"],
            })
    broker_version, streams_version = pinned_versions()
    doc = {
        "benchmark": "end to end on the real broker: local runner vs Kafka Streams (issue 7, item 2)",
        "date": date,
        "machine": {**host, "loadavg_end": loadavg()},
        "versions": {"kafka_broker": broker_version, "kafka_streams": streams_version, "java": version(["java", "-version"]),
                     "rustc": version(["rustc", "--version"])},
        "setup": {"records": a.records, "keys": a.keys, "partitions": PARTITIONS, "input_topic": input_topic,
                  "input_produced_now": produced, "runs": a.runs, "dynamodb_runs": a.dynamodb_runs or a.runs, "batch_size": a.batch_size,
                  "batching_window_ms": 500, "jvm_opts": a.jvm_opts, "kstreams_threads": 2},
        "medians": [{"mode": m, "contender": n, **v} for (m, n), v in med.items()],
        "ratios": ratios,
        "runs": results,
    }
    lines = [
        f"{a.records:,} records, {a.keys:,} keys, {PARTITIONS} partitions; {a.runs} run(s) per contender "
        f"({a.dynamodb_runs or a.runs} for the DynamoDB ones), "
        f"alternating; lambda-streams batch size {a.batch_size:,}; medians. {host['nproc']} cores ({host['cpu']}), "
        f"load average {host['loadavg_start']} at the start, {loadavg()} at the end; {date}.",
        "",
        "| mode | contender | guarantee | state | records/s (first record → done) | active s | wall s (process) | CPU s | peak RSS MiB | broker CPU s | emulator CPU s | load before → after (per run) |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for (m, n), v in med.items():
        loads = "; ".join(f"{r['loadavg_before'].split()[0]}→{r['loadavg_after'].split()[0]}"
                          for r in results if r["mode"] == m and r["contender"] == n)
        state = v["state"] or ("RocksDB" if m == "count" else "-")
        lines.append(f"| {m} | {n} | {v['guarantee']} | {state} | {v['records_per_s']:,.0f} | {v['active_s']:.2f} | "
                     f"{v['wall_s']:.2f} | {v['cpu_s']:.2f} | {v['peak_rss_mib']:.0f} | {fmt(v['broker_cpu_s'])} | "
                     f"{fmt(v['emulator_cpu_s'])} | {loads} |")
    lines += ["", "Ratios, lambda-streams / Kafka Streams (medians): throughput > 1 and wall-time speed-up > 1 "
              "mean lambda-streams is ahead; CPU and RSS < 1 mean it uses less.", "",
              "| mode | lambda-streams | Kafka Streams | throughput | wall speed-up | CPU s | peak RSS | compared |",
              "|---|---|---|---:|---:|---:|---:|---|"]
    for r in ratios:
        lines.append(f"| {r['mode']} | {r['lambda_streams']} | {r['kstreams']} | {r['throughput_ratio']:.2f}x | "
                     f"{r['wall_ratio']:.2f}x | {r['cpu_ratio']:.2f}x | {r['rss_ratio']:.2f}x | {r['note']} |")
    write_results(a.out, doc, lines)


if __name__ == "__main__":
    main()
