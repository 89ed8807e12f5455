"""Anchor (d) of the handler benchmark: Powertools for AWS Lambda (Python) on the same event.

Reads the event JSON that the Rust benchmark wrote (identical bytes), and times, per run:

- ``decode``: what the Python runtime and Powertools do before a handler sees a record:
  ``json.loads`` of the event, then ``aws_lambda_powertools.utilities.data_classes.KafkaEvent``
  and, for every record, ``decoded_key``, ``decoded_value`` (base64) and ``decoded_headers``;
- ``handler``: the same plus the pipeline of the Rust benchmark: the value parsed as JSON
  (``json_value``) into a typed ``PageView``, kept if ``duration_ms >= 30000``, mapped to a
  summary line, collected as output records.

Prints one JSON object: the median (and all samples) of each, in seconds.

Usage: python bench/powertools_anchor.py EVENT.json [--runs N]
"""

import argparse
import dataclasses
import json
import statistics
import sys
import time

import aws_lambda_powertools
from aws_lambda_powertools.utilities.data_classes import KafkaEvent


@dataclasses.dataclass
class PageView:
    event_id: str
    user_id: str
    session_id: str
    url: str
    referrer: str | None
    device: str
    country: str
    duration_ms: int
    scroll_depth: float
    ts: int


def decode(raw: bytes) -> int:
    event = KafkaEvent(json.loads(raw))
    n = 0
    for record in event.records:
        record.decoded_key
        record.decoded_value
        record.decoded_headers
        n += 1
    return n


def handler(raw: bytes) -> list:
    event = KafkaEvent(json.loads(raw))
    outputs = []
    for record in event.records:
        key = record.decoded_key
        record.decoded_headers
        v = record.json_value
        view = PageView(
            v["eventId"], v["userId"], v["sessionId"], v["url"], v.get("referrer"),
            v["device"], v["country"], v["durationMs"], v["scrollDepth"], v["ts"],
        )
        if view.duration_ms >= 30_000:
            summary = f"{view.country}|{view.device}|{view.url}|{view.duration_ms}"
            outputs.append(("engaged-views", key, summary.encode(), record.timestamp))
    return outputs


def timed(fn, raw: bytes, runs: int) -> list[float]:
    fn(raw)  # warm-up
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        fn(raw)
        samples.append(time.perf_counter() - t)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("event")
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    with open(args.event, "rb") as f:
        raw = f.read()
    records = decode(raw)
    outputs = len(handler(raw))
    result = {
        "python": sys.version.split()[0],
        "powertools": aws_lambda_powertools.__version__ if hasattr(aws_lambda_powertools, "__version__") else None,
        "event_bytes": len(raw),
        "records": records,
        "outputs": outputs,
        "runs": args.runs,
    }
    for name, fn in (("decode", decode), ("handler", handler)):
        samples = timed(fn, raw, args.runs)
        result[name] = {"median_s": statistics.median(samples), "samples_s": samples}
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
