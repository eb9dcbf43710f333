#!/usr/bin/env python3
"""Writes a large Kineto trace, deterministically, from a real one: the traceEvents of SRC
repeated COPIES times, each copy's "ts" shifted past the previous copy's end (the text of
every event, its key order and whitespace kept as Kineto wrote them, so bytes per event are
those of a real trace). Everything outside traceEvents is kept once.

usage: mktrace.py SRC(.json|.json.gz) COPIES OUT(.json|.json.gz)
"""
import gzip
import json
import re
import sys


def main():
    src, copies, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    opener = gzip.open if src.endswith(".gz") else open
    with opener(src, "rt", encoding="utf-8") as f:
        text = f.read()
    m = re.search(r'"traceEvents"\s*:\s*\[', text)
    if m is None:
        sys.exit(f"mktrace: {src} has no traceEvents array")
    lb = m.end() - 1
    events, end = json.JSONDecoder().raw_decode(text, lb)
    body = text[lb + 1:end - 1].rstrip()
    ts = [int(float(e["ts"])) for e in events if isinstance(e.get("ts"), (int, float))]
    span = (max(ts) - min(ts) + 1000) if ts else 0
    ts_re = re.compile(r'("ts":\s*)(\d+)')
    parts = []
    for c in range(copies):
        shift = c * span
        parts.append(body if shift == 0 else
                     ts_re.sub(lambda mm: mm.group(1) + str(int(mm.group(2)) + shift), body))
    data = text[:lb + 1] + ",".join(parts) + "\n" + text[end - 1:]
    if out.endswith(".gz"):
        with gzip.open(out, "wt", encoding="utf-8", compresslevel=6) as f:
            f.write(data)
    else:
        with open(out, "w", encoding="utf-8") as f:
            f.write(data)
    print(len(data.encode("utf-8")))


if __name__ == "__main__":
    main()
