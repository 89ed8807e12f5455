#!/usr/bin/env python3
"""Cold start and peak RSS of a function's release `bootstrap` (issue 7 item 4, issue 5),
against the Lambda Runtime API served by `cargo lambda watch --only-lambda-apis`.

Per run: a new process of the bootstrap. The invocation is posted to the Invoke API *before*
the process starts (cargo lambda holds it until the function asks for its next event), so
the time from spawn to the response is "process start to first event handled" (+ the HTTP
hops, which the warm invocation measures). Then a second (warm) invocation of the same event
on the same process, and the process's peak RSS (VmHWM in /proc/<pid>/status). The function's
EMF metrics (stdout; on when AWS_LAMBDA_FUNCTION_NAME is set, as here) give each batch's own
duration (BatchDuration), which splits the first event's time into the batch and the rest.
Finally the same with a large event (the 6 MB WordCount event) for the peak RSS.

Usage: bench/coldstart.py --bootstrap PATH --port P --event SMALL.json [--big-event BIG.json]
          [--runs N] [--env KEY=VALUE ...] [--json OUT]
Needs cargo-lambda on PATH (scripts/tools path). Stops only the processes it started.
"""
import argparse, json, os, socket, statistics, subprocess, tempfile, threading, time, urllib.request

p = argparse.ArgumentParser()
p.add_argument("--bootstrap", required=True)
p.add_argument("--port", type=int, default=9470)
p.add_argument("--event", required=True)
p.add_argument("--big-event")
p.add_argument("--runs", type=int, default=11)
p.add_argument("--big-runs", type=int, default=3)
p.add_argument("--env", action="append", default=[])
p.add_argument("--json")
p.add_argument("--log", default="/dev/null")
a = p.parse_args()

URL = f"http://127.0.0.1:{a.port}/2015-03-31/functions/_/invocations"


def invoke(data):
    req = urllib.request.Request(URL, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.read()


def wait_port(port, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on {port}")


def vm(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])  # kB


env = dict(os.environ)
env.update({
    "AWS_LAMBDA_FUNCTION_VERSION": "1",
    "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "128",
    "AWS_LAMBDA_RUNTIME_API": f"http://127.0.0.1:{a.port}/.rt",
    "AWS_LAMBDA_FUNCTION_NAME": "_",
})
for kv in a.env:
    k, v = kv.split("=", 1)
    env[k] = v

log = open(a.log, "ab")
watch = subprocess.Popen(
    ["cargo", "lambda", "watch", "--only-lambda-apis", "--ignore-changes",
     "--invoke-address", "127.0.0.1", "--invoke-port", str(a.port)],
    stdin=subprocess.DEVNULL, stdout=log, stderr=log)


def cold_run(data):
    """Returns (first_s, warm_s, hwm_first_kb, hwm_kb, response, batch_ms) for one new
    process; batch_ms: the BatchDuration of its batches (see batch_durations)."""
    result = {}

    def first():
        result["response"] = invoke(data)
        result["t1"] = time.perf_counter()

    t = threading.Thread(target=first)
    t.start()
    time.sleep(0.3)  # the invocation is queued before the process exists
    t0 = time.perf_counter()
    out = tempfile.TemporaryFile()  # the function's stdout: its EMF metrics (BatchDuration)
    proc = subprocess.Popen([a.bootstrap], env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=log)
    try:
        while t.is_alive():
            t.join(0.05)
            if proc.poll() is not None:
                raise SystemExit(f"the function exited with {proc.returncode} (see --log)")
        first_s = result["t1"] - t0
        hwm_first = vm(proc.pid, "VmHWM")
        result["cpu_first_ms"] = cpu_ms(proc.pid)
        w0 = time.perf_counter()
        invoke(data)
        warm_s = time.perf_counter() - w0
        hwm = vm(proc.pid, "VmHWM")
        result["cpu_warm_ms"] = cpu_ms(proc.pid) - result["cpu_first_ms"]
    finally:
        proc.kill()  # Popen.kill: the child's own (positive) pid
        proc.wait()
        out.seek(0)
        text = out.read()
        log.write(text)
    cpu = {"cpu_first_ms": result["cpu_first_ms"], "cpu_warm_ms": result["cpu_warm_ms"]}
    return first_s, warm_s, hwm_first, hwm, result["response"], batch_durations(text), cpu


def cpu_ms(pid):
    """The CPU time (ms) the process's live threads have used (/proc/<pid>/task/*/schedstat,
    nanoseconds on a CPU): start-up and work, without the time spent waiting for a CPU, so
    that it separates builds on a loaded machine where wall times do not. Threads that have
    exited are not counted (none of the function's by its first response)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total / 1e6


def batch_durations(stdout):
    """The BatchDuration (ms) of each batch, in order, from the function's EMF lines: the
    time in `process_with` (state, processing, producing the output; not the runtime, not the
    producer's creation)."""
    durations = []
    for line in stdout.splitlines():
        if line.startswith(b"{") and b'"BatchDuration"' in line:
            try:
                durations.append(json.loads(line)["BatchDuration"])
            except (ValueError, KeyError):
                pass
    return durations


try:
    wait_port(a.port)
    small = open(a.event, "rb").read()
    # Process-spawn overhead of this harness, for reference.
    spawn = []
    for _ in range(5):
        s0 = time.perf_counter()
        subprocess.run(["/bin/true"], stdin=subprocess.DEVNULL)
        spawn.append(time.perf_counter() - s0)
    runs = []
    for i in range(a.runs):
        first_s, warm_s, hwm1, hwm2, resp, batch, cpu = cold_run(small)
        runs.append({"first_ms": first_s * 1e3, "warm_ms": warm_s * 1e3, "hwm_kb_after_first": hwm1,
                     "hwm_kb_after_warm": hwm2, "batch_ms": batch, **cpu})
        print(f"run {i}: first {first_s*1e3:.1f} ms, warm {warm_s*1e3:.1f} ms, VmHWM {hwm2} kB, "
              f"batches {', '.join(f'{b:.1f}' for b in batch)} ms, {resp[:60]!r}", flush=True)
    out = {
        "bootstrap": a.bootstrap,
        "bootstrap_bytes": os.path.getsize(a.bootstrap),
        "event_bytes": len(small),
        "runs": runs,
        "median_first_ms": statistics.median(r["first_ms"] for r in runs),
        "median_warm_ms": statistics.median(r["warm_ms"] for r in runs),
        "median_first_minus_warm_ms": statistics.median(r["first_ms"] - r["warm_ms"] for r in runs),
        "median_hwm_kb_small": statistics.median(r["hwm_kb_after_warm"] for r in runs),
        # The function's own CPU time: process start to the first response, and the warm
        # invocation's (see cpu_ms).
        "median_cpu_first_ms": statistics.median(r["cpu_first_ms"] for r in runs),
        "median_cpu_warm_ms": statistics.median(r["cpu_warm_ms"] for r in runs),
        # The split of "first event handled": the first batch itself (state, processing,
        # output, including the first connections to DynamoDB and Kafka), and the rest
        # (process start-up, the runtime's first poll, the producer's creation, the HTTP hops).
        **({"median_first_batch_ms": statistics.median(r["batch_ms"][0] for r in runs),
            "median_warm_batch_ms": statistics.median(r["batch_ms"][1] for r in runs),
            "median_first_minus_first_batch_ms":
                statistics.median(r["first_ms"] - r["batch_ms"][0] for r in runs)}
           if all(len(r["batch_ms"]) >= 2 for r in runs) else {}),
        "spawn_true_median_ms": statistics.median(spawn) * 1e3,
        "loadavg": open("/proc/loadavg").read().split()[:3],
        "nproc": os.cpu_count(),
    }
    if a.big_event:
        big = open(a.big_event, "rb").read()
        big_runs = []
        for i in range(a.big_runs):
            first_s, warm_s, hwm1, hwm2, resp, _, _ = cold_run(big)
            big_runs.append({"first_ms": first_s * 1e3, "second_ms": warm_s * 1e3,
                             "hwm_kb_after_first": hwm1, "hwm_kb_after_second": hwm2})
            print(f"big run {i}: first {first_s*1e3:.1f} ms, second {warm_s*1e3:.1f} ms, VmHWM {hwm1} kB then {hwm2} kB, {resp[:60]!r}", flush=True)
        out["big_event_bytes"] = len(big)
        out["big_runs"] = big_runs
        out["median_hwm_kb_big"] = statistics.median(r["hwm_kb_after_second"] for r in big_runs)
    print(json.dumps({k: v for k, v in out.items() if k not in ("runs", "big_runs")}, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
finally:
    watch.kill()
    watch.wait()
