#!/usr/bin/env python3
"""Exactly-once output against at-least-once output (issue 15's benchmark row), on the real
broker: the local runner (lambda-streams, in-process, release build) with
`--output-guarantee exactly_once` (a transaction per source partition of each batch, design
notes section 5a) and with `--output-guarantee at_least_once` (idempotent producer), beside
Kafka Streams (bench/kstreams) with `exactly_once_v2` and `at_least_once`; the same input
topic, broker and machine, alternating runs.

Run through `bench/run --eos [ARGS]` (which builds both sides first), or directly:

    bench/eos.py --runner target/eos/local-runner --jar bench/kstreams/target/kstreams-bench.jar \
        [--records 200000] [--keys 10000] [--runs 2] [--batch-sizes 1000,10000] \
        [--states memory,dynamodb] [--modes stateless,count] [--no-kstreams] [--out bench/results/eos]
    bench/eos.py ... --partitions 1,8,32,64 [--per-event 512] [--events 100] [--keys 500] \
        [--states dynamodb] [--out bench/results/eos-partitions]

Two topologies, as in bench/e2e.py: `stateless` (filter + map → to) and `count` (count by
key → to_stream → to). lambda-streams keeps the count's state in memory (`--states memory`:
the output's cost alone) or in DynamoDB (`dynamodb`: the DynamoStore on the emulator, as the
function runs in Lambda; bench/run --eos starts an in-memory dynoxide of its own for it, as
--e2e does). Per run: throughput (records/s from the first record received to the last batch
done, as bench/e2e.py measures it) and, for lambda-streams, the function's time per batch
(p50/p99 over the run's invocations, from the runner's summary). Kafka Streams has no
batches: its number is throughput (its exactly_once_v2 commits a transaction every
commit.interval.ms = 100 ms). Every run is verified by bench/kstreams' Verify
(read_committed): exactly the expected output records, and every key's final count.

With `--partitions`, the cost of an event with many partitions: for each P, a fresh input
topic of P partitions fed by bench/kstreams' Rounds one round at a time (PER_EVENT / P
records to each partition, the next round once the runner committed the last), and a runner
with `--batch-size PER_EVENT` and a long batching window, so that each event holds every
partition (checked from the handler's log: partitions per event, producers initialised and
transactions committed, read from its `batch processed` and `transactions committed` lines).
The count topology only; output topic of 8 partitions.

Writes OUT.json and OUT.md; the machine's load average is recorded before and after every
run, `uptime` at the start. Stdlib only (and bench/e2e.py's helpers).
"""

import argparse
import datetime
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e  # noqa: E402  (the helpers of the end-to-end benchmark)

GUARANTEES = ["at_least_once", "exactly_once"]


def info(msg):
    print(f"bench/eos: {msg}", file=sys.stderr, flush=True)


class Contender:
    """A run's setting: Kafka Streams with a processing guarantee, or the local runner with
    an output guarantee, a state store and a batch size (or a partition count per event)."""

    def __init__(self, side, guarantee, batch=None, state=None, partitions=None):
        self.side, self.guarantee, self.batch, self.state, self.partitions = side, guarantee, batch, state, partitions
        if side == "kstreams":
            self.name = {"at_least_once": "kstreams-alos", "exactly_once_v2": "kstreams-eosv2"}[guarantee]
        else:
            short = {"at_least_once": "alo", "exactly_once": "eos"}[guarantee]
            where = f"p{partitions}" if partitions else f"b{batch}"
            self.name = f"lambda-streams-{state}-{short}-{where}"

    def key(self):
        return {"side": self.side, "guarantee": self.guarantee, "batch_size": self.batch, "state": self.state,
                "partitions": self.partitions}


def contenders(a, mode):
    """The contenders of a mode: Kafka Streams' two guarantees, then per state store and
    batch size lambda-streams' two output guarantees (stateless: in memory only)."""
    out = [] if a.no_kstreams else [Contender("kstreams", "at_least_once"), Contender("kstreams", "exactly_once_v2")]
    states = a.states if mode == "count" else ["memory"]
    for state in states:
        for b in a.batch_sizes:
            out += [Contender("lambda-streams", g, batch=b, state=state) for g in GUARANTEES]
    return out


def runner_cmd(a, mode, c, run_id):
    # A fresh application id per run: its transactional ids and shadow group (which holds
    # the committed progress per input partition) are the run's own.
    return [a.runner, "run", "--function", f"bench-{mode}", "--state", c.state, "--table", run_id,
            "--guarantee", "exactly_once", "--output-guarantee", c.guarantee,
            "--application-id", f"{run_id}-app", "--group-id", f"{run_id}-group", "--quiet"]


def transactions(out):
    """Per event, from the handler's log: partitions, producers initialised, transactions
    committed (the `transactions committed` line is logged under exactly-once output only)."""
    parts = [len(m.group(1).split(",")) for m in re.finditer(r"batch processed partitions=(\S+)", out)]
    inits = [int(x) for x in re.findall(r"initialised=(\d+)", out)]
    commits = [int(x) for x in re.findall(r" committed=(\d+)", out)]
    return {"events_logged": len(parts), "partitions_per_event": parts, "producers_initialised": sum(inits),
            "transactions_committed": sum(commits)}


def run_one(a, mode, c, index, input_topic, stamp):
    run_id = f"bench-eos-{stamp}-{mode}-{c.name}-{index}"
    output = f"{run_id}-out"
    e2e.admin(a.jar, "create", output, e2e.PARTITIONS)
    state_dir = os.path.join(a.state_root, run_id)
    if c.side == "kstreams":
        cmd = e2e.kstreams_cmd(a, run_id, input_topic, output, mode, c.guarantee, state_dir)
        env = dict(os.environ)
    else:
        cmd = runner_cmd(a, mode, c, run_id) + ["--batch-size", str(c.batch), "--until-caught-up"]
        env = e2e.runner_env(input_topic, output)
    measured, out, _ = e2e.measure(a, run_id, cmd, env)
    r = {"mode": mode, "contender": c.name, **c.key(), "run": index, **measured, **e2e.side_results(c.side, out)}
    r["records_per_s"] = r["records"] / r["active_s"]
    e2e.verify_and_clean(a, r, output, mode, a.records, a.keys, state_dir,
                         table=run_id if c.state == "dynamodb" else None)
    latency = (f", per batch p50 {r['batch_p50_ms']:.1f} ms p99 {r['batch_p99_ms']:.1f} ms "
               f"({r['records_per_batch']:,.0f} records/batch)") if c.side != "kstreams" else ""
    info(f"{mode:9} {c.name:36} run {index}: {r['records_per_s']:>10,.0f} records/s ({r['active_s']:.2f} s active)"
         f"{latency}, CPU {r['cpu_s']:.2f} s, load {r['loadavg_before']} -> {r['loadavg_after']}; verified")
    return r


def run_partitions(a, c, index, stamp):
    """One run of the partition sweep (see the module's documentation)."""
    p = c.partitions
    per = a.per_event // p
    records = per * p * a.events
    run_id = f"bench-eosp-{stamp}-{c.name}-{index}"
    input_topic, output = f"{run_id}-in", f"{run_id}-out"
    e2e.admin(a.jar, "create", input_topic, p)
    e2e.admin(a.jar, "create", output, e2e.PARTITIONS)
    group = f"{run_id}-group"
    # Rounds feeds the group while the runner runs (it exits once idle and committed).
    feeder = e2e.java_background(a.jar, "Rounds", e2e.BOOTSTRAP, input_topic, group, p, per, a.events, a.keys)
    cmd = runner_cmd(a, "count", c, run_id) + [
        "--batch-size", str(per * p), "--batching-window-ms", "10000",
        "--until-idle", "--idle-timeout-ms", "6000"]
    env = e2e.runner_env(input_topic, output, rust_log="warn,lambda_streams::handler=info")
    try:
        measured, out, _ = e2e.measure(a, run_id, cmd, env)
        fed = e2e.java_wait(feeder, timeout=120)
    finally:
        if feeder.poll() is None:
            feeder.kill()
    r = {"mode": "count", "contender": c.name, **c.key(), "run": index, "per_partition": per, **measured,
         **e2e.side_results(c.side, out), **transactions(out), "rounds": fed}
    r["records_per_s"] = r["records"] / r["active_s"]
    pe = r.pop("partitions_per_event")
    r["partitions_per_event_min"], r["partitions_per_event_max"] = min(pe, default=0), max(pe, default=0)
    r["partitions_per_event_median"] = statistics.median(pe) if pe else 0
    if fed and fed.get("round_ms"):
        r["round_p50_ms"] = statistics.median(fed["round_ms"])
    e2e.verify_and_clean(a, r, output, "count", records, a.keys, table=run_id)
    info(f"P={p:<3} {c.name:36} run {index}: {r['records_per_s']:>8,.0f} records/s, per batch p50 "
         f"{r['batch_p50_ms']:.1f} ms p99 {r['batch_p99_ms']:.1f} ms max {r['batch_max_ms']:.1f} ms, "
         f"partitions/event {r['partitions_per_event_min']}-{r['partitions_per_event_max']}, "
         f"{r['producers_initialised']} producers, {r['transactions_committed']} transactions, "
         f"peak RSS {r['peak_rss_kib'] / 1024:.0f} MiB, load {r['loadavg_before']} -> {r['loadavg_after']}; verified")
    return r


def medians(plan, results, keys):
    """Per contender, the medians of `keys` over its runs, with the loads of each run."""
    med = {}
    for group, c in plan:
        rs = [r for r in results if r.get("group") == group and r["contender"] == c.name]
        m = {"group": group, "contender": c.name, **c.key(), "runs": len(rs),
             "loads": [f"{r['loadavg_before'].split()[0]}→{r['loadavg_after'].split()[0]}" for r in rs]}
        for k in keys:
            values = [r[k] for r in rs if r.get(k) is not None]
            if values:
                m[k] = statistics.median(values)
        med[(group, c.name)] = m
    return med


def ratio_rows(med, pairs):
    """EOS over ALO for each (group, EOS contender, ALO contender) in `pairs`."""
    rows = []
    for group, eos, alo in pairs:
        e, o = med[(group, eos)], med[(group, alo)]
        row = {"group": group, "eos": eos, "alo": alo,
               "throughput_eos_over_alo": e["records_per_s"] / o["records_per_s"]}
        for k in ("batch_p50_ms", "batch_p99_ms", "peak_rss_kib"):
            if k in e and k in o:
                row[f"{k}_eos_over_alo"] = e[k] / o[k]
        rows.append(row)
    return rows


def cell(m, k, f):
    return f.format(m[k]) if m.get(k) is not None else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    e2e.common_args(ap, "bench/results/eos")
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--batch-sizes", default="1000,10000")
    ap.add_argument("--states", default="memory", help="where lambda-streams keeps the count's state: "
                    "memory, dynamodb or both (comma-separated)")
    ap.add_argument("--modes", default="stateless,count")
    ap.add_argument("--no-kstreams", action="store_true", help="lambda-streams' contenders only")
    ap.add_argument("--partitions", default="", help="the partition sweep: partitions per event, e.g. 1,8,32,64")
    ap.add_argument("--per-event", type=int, default=512, help="the sweep's records per event")
    ap.add_argument("--events", type=int, default=100, help="the sweep's events per run")
    a = ap.parse_args()
    e2e.prepare(a)
    a.batch_sizes = [int(b) for b in a.batch_sizes.split(",") if b]
    a.states = [s for s in a.states.split(",") if s]
    sweep = [int(p) for p in a.partitions.split(",") if p]
    stamp = datetime.datetime.now().strftime("%H%M%S")
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    host = e2e.machine()
    broker_version, streams_version = e2e.pinned_versions()
    keys = ["records_per_s", "cpu_s", "peak_rss_kib", "batch_p50_ms", "batch_p99_ms", "batch_max_ms",
            "records_per_batch", "producers_initialised", "transactions_committed", "batches",
            "partitions_per_event_median", "round_p50_ms", "emulator_cpu_s", "broker_cpu_s"]
    results = []
    if sweep:
        plan = [(f"p{p}", Contender("lambda-streams", g, state=s, partitions=p))
                for p in sweep for s in a.states for g in GUARANTEES]
        for index, (group, c) in e2e.alternating(plan, a.runs):
            results.append({"group": group, **run_partitions(a, c, index, stamp)})
        setup = {"per_event": a.per_event, "events": a.events, "keys": a.keys, "partitions": sweep,
                 "output_partitions": e2e.PARTITIONS, "states": a.states, "runs": a.runs, "topology": "count"}
    else:
        input_topic = f"bench-e2e-input-{a.records}-{a.keys}"
        produced = e2e.ensure_input(a.jar, input_topic, a.records, a.keys)
        plan = [(mode, c) for mode in a.modes.split(",") for c in contenders(a, mode)]
        for index, (mode, c) in e2e.alternating(plan, a.runs):
            results.append({"group": mode, **run_one(a, mode, c, index, input_topic, stamp)})
        setup = {"records": a.records, "keys": a.keys, "partitions": e2e.PARTITIONS, "input_topic": input_topic,
                 "input_produced_now": produced, "runs": a.runs, "batch_sizes": a.batch_sizes,
                 "lambda_streams_states": a.states, "jvm_opts": a.jvm_opts, "kstreams_threads": 2}
    med = medians(plan, results, keys)
    pairs = []
    for group, c in plan:
        if c.guarantee in ("exactly_once", "exactly_once_v2"):
            alo = next(o for g, o in plan if g == group and o.side == c.side and o.guarantee == "at_least_once"
                       and (o.batch, o.state, o.partitions) == (c.batch, c.state, c.partitions))
            pairs.append((group, c.name, alo.name))
    ratios = ratio_rows(med, pairs)
    doc = {
        "benchmark": ("exactly-once output vs at-least-once output per partitions in one event (issue 15)" if sweep
                      else "exactly-once output vs at-least-once output, lambda-streams beside Kafka Streams (issue 15)"),
        "date": date,
        "machine": {**host, "loadavg_end": e2e.loadavg()},
        "versions": {"kafka_broker": broker_version, "kafka_streams": streams_version},
        "setup": setup,
        "medians": list(med.values()),
        "ratios": ratios,
        "runs": results,
    }
    where = (f"count by key, {a.keys:,} keys, {a.per_event} records per event spread evenly over P partitions, "
             f"{a.events} events per run" if sweep else
             f"{a.records:,} records, {a.keys:,} keys, {e2e.PARTITIONS} partitions")
    lines = [
        f"{where}; {a.runs} run(s) per contender, alternating; medians. lambda-streams: local runner (release), "
        f"state {' and '.join(a.states)}. {host['nproc']} cores ({host['cpu']}); `uptime` at the start: "
        f"{host['uptime_start']}; load average {e2e.loadavg()} at the end; {date}.",
        "",
    ]
    if sweep:
        lines += ["| partitions per event | contender | output guarantee | state | records/batch | records/s | "
                  "batch p50 ms | batch p99 ms | batch max ms | producers initialised | transactions | "
                  "peak RSS MiB | CPU s | load before → after (per run) |",
                  "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for m in med.values():
            rss = m["peak_rss_kib"] / 1024
            lines.append(f"| {m['partitions']} | {m['contender']} | {m['guarantee']} | {m['state']} | "
                         f"{cell(m, 'records_per_batch', '{:,.0f}')} | {m['records_per_s']:,.0f} | "
                         f"{cell(m, 'batch_p50_ms', '{:.1f}')} | {cell(m, 'batch_p99_ms', '{:.1f}')} | "
                         f"{cell(m, 'batch_max_ms', '{:.1f}')} | {cell(m, 'producers_initialised', '{:.0f}')} | "
                         f"{cell(m, 'transactions_committed', '{:.0f}')} | {rss:.0f} | {m['cpu_s']:.2f} | "
                         f"{'; '.join(m['loads'])} |")
    else:
        lines += ["| mode | contender | output guarantee | state | batch size | records/batch | records/s | "
                  "batch p50 ms | batch p99 ms | CPU s | load before → after (per run) |",
                  "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
        for m in med.values():
            state = m["state"] or ("RocksDB" if m["group"] == "count" else "-")
            lines.append(f"| {m['group']} | {m['contender']} | {m['guarantee']} | {state} | {m['batch_size'] or '-'} | "
                         f"{cell(m, 'records_per_batch', '{:,.0f}')} | {m['records_per_s']:,.0f} | "
                         f"{cell(m, 'batch_p50_ms', '{:.1f}')} | {cell(m, 'batch_p99_ms', '{:.1f}')} | "
                         f"{m['cpu_s']:.2f} | {'; '.join(m['loads'])} |")
    lines += ["", "Exactly-once over at-least-once (medians): throughput < 1 is the cost in records/s; "
              "per-batch latency and RSS > 1 are the cost per batch and in memory.", "",
              "| group | exactly-once | at-least-once | throughput EOS/ALO | batch p50 EOS/ALO | batch p99 EOS/ALO | peak RSS EOS/ALO |",
              "|---|---|---|---:|---:|---:|---:|"]
    for r in ratios:
        x = lambda k: f"{r[k]:.2f}x" if k in r else "-"  # noqa: E731
        lines.append(f"| {r['group']} | {r['eos']} | {r['alo']} | {r['throughput_eos_over_alo']:.2f}x | "
                     f"{x('batch_p50_ms_eos_over_alo')} | {x('batch_p99_ms_eos_over_alo')} | "
                     f"{x('peak_rss_kib_eos_over_alo')} |")
    e2e.write_results(a.out, doc, lines)


if __name__ == "__main__":
    main()
