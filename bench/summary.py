#!/usr/bin/env python3
"""One table of every goal of the benchmark suite (issue 7), from the results the parts
wrote: bench/results/{handler,handler-lambda-cpu,cost,size,e2e,eos,eos-dynamodb}.json. Writes bench/results/summary.{json,md}.

    python3 bench/summary.py [--results bench/results] [--e2e NAME]

A part whose results file is missing is reported as not run. Every value is copied from the
part's own JSON (medians); nothing is measured here. Stdlib only.
"""

import argparse
import datetime
import json
import os


def load(results, name):
    path = os.path.join(results, f"{name}.json")
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def row(part, what, value, goal, met, source):
    return {"part": part, "what": what, "value": value, "goal": goal,
            "met": met, "source": source}


def handler_rows(h, name="handler"):
    lambda_cpu = name == "handler-lambda-cpu"
    part = "1 handler (cargo lambda's CPU)" if lambda_cpu else "1 handler"
    if h is None:
        return [row(part, "not run", "-", "-", None, "bench/run --lambda-cpu" if lambda_cpu else "bench/run")]
    r, q = h["results"], h["ratios"]
    src = f"{name}.json ({h['date']}, load {h['machine']['loadavg_before']}; {h.get('build', 'generic x86-64')})"
    dec, han = r["decode/lambda_streams"]["mb_per_s"], r["handler/lambda_streams"]["mb_per_s"]
    naive = q["decode: lambda_streams speed / naive_rust"]
    pt = q["decode: lambda_streams speed / powertools_python"]
    rows = [
        row(part, "decode (on the cores available), MB/s of event JSON", f"{dec:,.0f}", ">= 1,000", dec >= 1000, src),
        row(part, "decode + stateless pipeline, MB/s", f"{han:,.0f}", ">= 1,000", han >= 1000, src),
        row(part, "decode speed / naive Rust", f"{naive:.2f}x", "~8x", naive >= 8, src),
        row(part, "decode speed / Powertools (Python)", f"{pt:.1f}x", "~35x", pt >= 35, src),
    ]
    if "handler/lambda_streams_six" in r:
        six = r["handler/lambda_streams_six"]["mb_per_s"]
        rows.insert(2, row(part, "decode + pipeline with Json<T> into six fields (the goal's struct), MB/s",
                           f"{six:,.0f}", ">= 1,000", six >= 1000, src))
    if "handler/lambda_streams_six_one_thread" in r:
        one = r["handler/lambda_streams_six_one_thread"]["mb_per_s"]
        rows.insert(3, row(part, "the same on one thread (a function under 3,538 MB: less than two vCPUs of share), MB/s",
                           f"{one:,.0f}", "-", None, src))
    for key, what in (("handler/lambda_streams_six_overlap", "the same with overlap_reading (glibc's malloc), MB/s"),
                      ("handler/lambda_streams_six (mimalloc)", "six fields, mimalloc as the global allocator, MB/s"),
                      ("handler/lambda_streams_six_overlap (mimalloc)",
                       "six fields, mimalloc and overlap_reading, MB/s")):
        if key in r:
            mb = r[key]["mb_per_s"]
            rows.insert(len(rows) - 2, row(part, what, f"{mb:,.0f}", ">= 1,000", mb >= 1000, src))
    if "decode/lambda_streams_one_thread" in r:
        one = r["decode/lambda_streams_one_thread"]["mb_per_s"]
        rows.insert(1, row(part, "decode on one thread, MB/s of event JSON (issue 16 item 7)",
                           f"{one:,.0f}", ">= 2,500", one >= 2500, src))
    ins = h.get("callgrind_instructions_per_run") or {}
    if "decode/lambda_streams" in ins:
        n = ins["decode/lambda_streams"] / h["event"]["bytes"]
        rows.append(row(part, "decode, instructions per byte (callgrind)", f"{n:.1f}", "-", None, src))
    return rows


def e2e_rows(e, name):
    if e is None:
        return [row("2 end to end", "not run", "-", "-", None, "bench/run --e2e")]
    src = f"{name}.json ({e['date']}, {e['setup']['records']:,} records)"
    rows = []
    for r in e["ratios"]:
        what = f"{r['mode']}: {r['lambda_streams']} / {r['kstreams']} ({r['note']})"
        equal = r["note"].startswith("equal") or r["note"].startswith("exactly-once")
        value = (f"throughput {r['throughput_ratio']:.2f}x, wall {r['wall_ratio']:.2f}x, "
                 f"CPU {r['cpu_ratio']:.2f}x, RSS {r['rss_ratio']:.2f}x")
        goal = "ahead (> 1x)" if equal else "- (not equal guarantees)"
        met = (r["throughput_ratio"] > 1 and r["wall_ratio"] > 1) if equal else None
        rows.append(row("2 end to end", what, value, goal, met, src))
    return rows


def cost_rows(c):
    if c is None:
        return [row("3 cost", "not run", "-", "-", None, "bench/run --cost")]
    src = f"cost.json ({len(c['results'])} configurations)"
    rows = []
    for guarantee in sorted({r["guarantee"] for r in c["results"]}):
        rs = [r for r in c["results"] if r["guarantee"] == guarantee]
        worst = max(r["requests_over_floor"] for r in rs)
        usd = [r["usd_per_million_records"]["total"] for r in rs]
        wru = [r["per_1000_records"]["write_units"] for r in rs]
        value = (f"at most {worst:.2f} over {len(rs)} batch sizes x key counts; {min(wru):,.1f}-{max(wru):,.1f} "
                 f"WRU per 1k records; ${min(usd):.3f}-${max(usd):.3f} per M records")
        rows.append(row("3 cost", f"{guarantee}: DynamoDB write requests / floor (distinct items per batch)",
                        value, "1.00 (the floor)", worst <= 1.0 + 1e-9, src))
    return rows


def size_rows(s):
    if s is None:
        return [row("4 size", "not run", "-", "-", None, "bench/run --size")]
    c, g = s["coldstart"], s["goals"]
    src = f"size.json ({s['date']}, load {' '.join(c.get('loadavg', []))})"
    first, z, rss = c["median_first_ms"], s["bootstrap_zip_bytes"], c["median_hwm_kb_big"]
    return [
        row("4 size", "process start -> first event handled, ms", f"{first:.1f}", f"<= {g['first_event_ms']}",
            first <= g["first_event_ms"], src),
        row("4 size", "bootstrap.zip, bytes", f"{z:,}", f"<= {g['zip_bytes']:,}", z <= g["zip_bytes"], src),
        row("4 size", "peak RSS handling a 6 MB event, KiB", f"{rss:,}", f"<= {g['peak_rss_kb']:,}",
            rss <= g["peak_rss_kb"], src),
    ]


def eos_rows(e, name="eos"):
    """The exactly-once output mode beside Kafka Streams' exactly_once_v2 (bench/run --eos):
    each lambda-streams exactly-once contender's throughput and CPU over Kafka Streams', at
    equal guarantees where the state is durable on both (stateless, or the count on DynamoDB),
    and the price of exactly once over at least once on each side."""
    if e is None:
        return [row("5 exactly once", f"{name}: not run", "-", "-", None, "bench/run --eos")]
    src = f"{name}.json ({e['date']}, {e['setup']['records']:,} records)"
    med = e["medians"]
    rows = []
    for group in sorted({m["group"] for m in med}, reverse=True):
        ks = next((m for m in med if m["group"] == group and m["contender"] == "kstreams-eosv2"), None)
        if ks is None:
            continue
        for m in med:
            if m["group"] != group or m["side"] != "lambda-streams" or m["guarantee"] != "exactly_once":
                continue
            equal = group == "stateless" or m["state"] == "dynamodb"
            note = ("equal: exactly-once output on both" if equal else
                    "in-memory state (not durable) vs RocksDB + changelog")
            tput, cpu = m["records_per_s"] / ks["records_per_s"], m["cpu_s"] / ks["cpu_s"]
            value = f"throughput {tput:.2f}x, CPU {cpu:.2f}x, batch p50 {m['batch_p50_ms']:.1f} ms"
            if m.get("emulator_cpu_s"):
                value += f", the emulator's CPU {m['emulator_cpu_s']:.1f} s apart"
            goal = "ahead (> 1x)" if equal else "- (not equal guarantees)"
            rows.append(row("5 exactly once", f"{group}: {m['contender']} / kstreams-eosv2 ({note})",
                            value, goal, tput > 1 if equal else None, src))
    for r in e["ratios"]:
        rows.append(row("5 exactly once", f"{r['group']}: {r['eos']} / {r['alo']} (the price of exactly once)",
                        f"throughput {r['throughput_eos_over_alo']:.2f}x", "-", None, src))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--e2e", default="e2e", help="the end-to-end results file's name (default e2e)")
    a = ap.parse_args()
    rows = (handler_rows(load(a.results, "handler"))
            + handler_rows(load(a.results, "handler-lambda-cpu"), "handler-lambda-cpu") + e2e_rows(load(a.results, a.e2e), a.e2e)
            + cost_rows(load(a.results, "cost")) + size_rows(load(a.results, "size"))
            + eos_rows(load(a.results, "eos")) + eos_rows(load(a.results, "eos-dynamodb"), "eos-dynamodb"))
    out = {
        "benchmark": "summary of the suite (issue 7)",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "rows": rows,
    }
    with open(os.path.join(a.results, "summary.json"), "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    mark = {True: "met", False: "**not met**", None: "-"}
    lines = ["Every goal of the suite, from the parts' own results (medians; see BENCHMARKS.md for "
             "the method and what each means).", "",
             "| part | what | value | goal | met | from |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['part']} | {r['what']} | {r['value']} | {r['goal']} | {mark[r['met']]} | {r['source']} |")
    md = "\n".join(lines) + "\n"
    with open(os.path.join(a.results, "summary.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
