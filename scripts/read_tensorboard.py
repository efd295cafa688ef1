"""Reads a directory of TensorBoard event files with TensorBoard's own reader and prints every
scalar series as JSON: {"tag": [[step, value], ...], ...}. The Rust tests compare it with the
run's metrics log, so the files are checked by the reader users' tools use.

Usage: python3 scripts/read_tensorboard.py DIR
"""

import json
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main() -> None:
    accumulator = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
    accumulator.Reload()
    series = {
        tag: [[event.step, event.value] for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }
    json.dump(series, sys.stdout)


if __name__ == "__main__":
    main()
