"""Short table from an Nsight Compute report exported by scripts/ncu-kernels.sh: the headline metrics
of the details page, the warp stall reasons (cycles per issued instruction) from the raw page, and the
executed instruction mix by SASS opcode from the source page. Tolerant of missing pages and names
(they differ between ncu versions): prints what it finds."""
import collections
import csv
import re
import sys

HEADLINE = ("Duration", "Elapsed Cycles", "SM Frequency", "Registers Per Thread", "Achieved Occupancy",
            "Compute (SM) Throughput", "Memory Throughput", "Issue Slots Busy", "Issued Ipc Active",
            "No Eligible", "Active Warps Per Scheduler", "Eligible Warps Per Scheduler",
            "Warp Cycles Per Issued Instruction", "Executed Instructions", "Executed Ipc Active")


def rows(path):
    try:
        with open(path, newline="") as f:
            return list(csv.reader(f))
    except OSError:
        return []


def details(prefix):
    table = rows(prefix + ".details.csv")
    if not table:
        return
    head = table[0]
    name, unit, value = (head.index(c) for c in ("Metric Name", "Metric Unit", "Metric Value"))
    seen = set()
    print("-- details")
    for r in table[1:]:
        if len(r) > value and r[name] in HEADLINE and r[name] not in seen:
            seen.add(r[name])
            print(f"{r[name]:36s} {r[value]:>14s} {r[unit]}")


def stalls(prefix):
    table = rows(prefix + ".raw.csv")
    if len(table) < 3:
        return
    head, values = table[0], table[2]  # row 1 holds the units
    found = []
    for i, n in enumerate(head):
        m = re.match(r"smsp__average_warp_latency_issue_stalled_(\w+)\.ratio$", n) or \
            re.match(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$", n)
        if m and i < len(values):
            try:
                found.append((float(values[i].replace(",", "")), m.group(1)))
            except ValueError:
                pass
    if found:
        print("-- warp stalls (cycles per issued instruction)")
        for v, n in sorted(found, reverse=True)[:10]:
            print(f"{n:36s} {v:14.2f}")


def instruction_mix(prefix):
    table = rows(prefix + ".sass.csv")
    if not table:
        return
    head = table[0]
    src = next((i for i, c in enumerate(head) if c.lower() in ("source", "sass")), None)
    exe = next((i for i, c in enumerate(head) if "instructions executed" in c.lower()), None)
    if src is None or exe is None:
        print("-- source page: columns", head[:8])
        return
    by_op = collections.Counter()
    total = 0
    for r in table[1:]:
        if len(r) <= max(src, exe):
            continue
        try:
            n = float(r[exe].replace(",", ""))
        except ValueError:
            continue
        m = re.match(r"\s*(@!?U?P\w+\s+)?([A-Z0-9_]+)", r[src])
        if m:
            by_op[m.group(2)] += n
            total += n
    if total:
        print(f"-- executed warp instructions by opcode (total {total:.3g})")
        for op, n in by_op.most_common(20):
            print(f"{op:16s} {n:14.4g} {100 * n / total:6.1f}%")


if __name__ == "__main__":
    prefix = sys.argv[1]
    print(f"== {prefix}")
    details(prefix)
    stalls(prefix)
    instruction_mix(prefix)
