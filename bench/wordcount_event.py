#!/usr/bin/env python3
"""Writes a WordCount event at the Lambda limit: self-managed Kafka, 4 partitions of
`text-lines`, 10,000 records of English-like text lines (about 330 bytes each), just under
6 MB of JSON. Deterministic. Usage: bench/wordcount_event.py OUT.json [--vocabulary N]"""
import argparse, base64, json, random

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--records", type=int, default=10_000)
p.add_argument("--vocabulary", type=int, default=5_000)
p.add_argument("--line-bytes", type=int, default=330)
a = p.parse_args()

rng = random.Random(7)
letters = "etaoinshrdlucmfwypvbgkjqxz"
vocab = sorted({"".join(rng.choice(letters[: 8 + i % 18]) for _ in range(2 + i % 9)) for i in range(a.vocabulary * 2)})
vocab = vocab[: a.vocabulary]
records = {}
parts = 4
for p_ in range(parts):
    rs = []
    for i in range(a.records // parts):
        words = []
        while sum(len(w) + 1 for w in words) < a.line_bytes:
            words.append(vocab[min(int(rng.paretovariate(1.1)) - 1, len(vocab) - 1)] if rng.random() < 0.5 else rng.choice(vocab))
        line = " ".join(words).encode()
        rs.append({
            "topic": "text-lines", "partition": p_, "offset": 1000 + i,
            "timestamp": 1764460800000 + i, "timestampType": "CREATE_TIME",
            "key": None, "value": base64.b64encode(line).decode(), "headers": [],
        })
    records[f"text-lines-{p_}"] = rs
event = {"eventSource": "SelfManagedKafka", "bootstrapServers": "127.0.0.1:9092", "records": records}
data = json.dumps(event, separators=(",", ":")).encode()
with open(a.out, "wb") as f:
    f.write(data)
print(f"{a.out}: {len(data):,} bytes, {a.records:,} records")
