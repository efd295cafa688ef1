"""Device memory stays flat over a long run (issue 51): reads a `--metrics-out` log and checks
that, after the first fifth of the run (warm-up, the allocator's caches filling), every device's
allocated bytes vary by at most 1 MiB and its reserved bytes by at most 1% (or 8 MiB).

    python3 scripts/gpu/flat_memory.py METRICS.jsonl
"""

import json
import sys

MIB = 1 << 20


def main(path):
    events = {}
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            if record.get("event") == "device" and "memory_allocated" in record:
                events.setdefault(record["device"], []).append(record)
    if not events:
        print(f"FAIL: no device events with memory in {path}")
        return 1
    failed = 0
    for device, records in events.items():
        settled = records[len(records) // 5 :]
        if len(settled) < 4:
            print(f"FAIL: {device}: only {len(records)} device events; log more often")
            failed = 1
            continue
        allocated = [r["memory_allocated"] for r in settled]
        reserved = [r["memory_reserved"] for r in settled]
        spread_a, spread_r = max(allocated) - min(allocated), max(reserved) - min(reserved)
        ok = spread_a <= MIB and spread_r <= max(8 * MIB, max(reserved) // 100)
        print(
            f"{'ok' if ok else 'FAIL'}: {device}: over {len(settled)} events after warm-up, allocated "
            f"{min(allocated) / MIB:.1f}-{max(allocated) / MIB:.1f} MiB, reserved "
            f"{min(reserved) / MIB:.1f}-{max(reserved) / MIB:.1f} MiB"
        )
        failed |= not ok
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
