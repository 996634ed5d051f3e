"""Silent loads of every artifact type under random single-bit flips and truncations (the table in docs/).

For each type of tests/artifact_cases.py: 45 single-bit flips at uniform positions of the tensor file and 45 of the
metadata JSON (numpy seed 0; 90 per type), plus 6 truncations of each file, every one loaded by the type's public
loader. "silent, changed": loaded without an error and different from the original (a wrong number); "silent,
identical": loaded bit-identical (a flip that leaves the content unchanged); "refused": an exception.

Run against any checkout: ``PYTHONPATH=<checkout>/src python benchmarks/bench_artifact_flips.py [flips_per_file]``
(the cases fall back to the earlier API where it differs). Prints a Markdown table and the CPU and wall seconds.
"""

from __future__ import annotations

import collections
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from tests.artifact_cases import cases, run_mutations  # noqa: E402

torch.set_num_threads(1)


def main() -> None:
    flips = int(sys.argv[1]) if len(sys.argv) > 1 else 45
    t0, c0 = time.perf_counter(), time.process_time()
    rows = ["| artifact | flips: silent, changed | flips: silent, identical | truncations: silent, changed | "
            "refusals: exception types |", "|---|---|---|---|---|"]
    for case in cases():
        with tempfile.TemporaryDirectory() as d:
            res = run_mutations(case, Path(d), flips)
        flip = [r for r in res if r.op.startswith("flip")]
        trunc = [r for r in res if r.op.startswith("truncate")]
        changed = collections.Counter(r.file for r in flip if r.outcome == "changed")
        ident = sum(r.outcome == "identical" for r in flip)
        types = collections.Counter(type(r.error).__name__ for r in res if r.error is not None)
        rows.append(f"| {case.name} | {sum(changed.values())}/{len(flip)} (tensors {changed['tensors']}, json "
                    f"{changed['json']}) | {ident}/{len(flip)} | {sum(r.outcome == 'changed' for r in trunc)}/"
                    f"{len(trunc)} | {', '.join(f'{k} {v}' for k, v in types.most_common())} |")
    print("\n".join(rows))
    print(f"\n{os.environ.get('PYTHONPATH', '')}: wall {time.perf_counter() - t0:.1f} s, CPU "
          f"{time.process_time() - c0:.1f} s")


if __name__ == "__main__":
    main()
