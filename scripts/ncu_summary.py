"""Short table from an Nsight Compute report exported by scripts/ncu-kernels.sh: the headline metrics
of the details page, the warp stall reasons (cycles per issued instruction) from the raw page, and the
executed instruction mix by SASS opcode, the instructions that collect the most stall samples and
the samples split by how often a warp runs the code, from the source page. Tolerant of missing pages and names
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


def source_table(prefix):
    """The source page's header and rows: the header is the row naming Address and Source (ncu 2025+
    writes a kernel-name line above it)."""
    table = rows(prefix + ".sass.csv")
    for at, r in enumerate(table[:5]):
        if any(c.lower() in ("source", "sass") for c in r) and "Address" in r:
            return r, table[at + 1:]
    return (table[0], table[1:]) if table else ([], [])


def number(text):
    try:
        return float(text.replace(",", "")) if text else 0.0
    except ValueError:
        return None


def instruction_mix(prefix):
    head, body = source_table(prefix)
    if not head:
        return
    src = next((i for i, c in enumerate(head) if c.lower() in ("source", "sass")), None)
    exe = next((i for i, c in enumerate(head) if c.lower() == "instructions executed"), None)
    if src is None or exe is None:
        print("-- source page: columns", head[:8])
        return
    by_op = collections.Counter()
    total = 0
    for r in body:
        if len(r) <= max(src, exe):
            continue
        n = number(r[exe])
        if n is None:
            continue
        m = re.match(r"\s*(@!?U?P\w+\s+)?([A-Z0-9_]+)", r[src])
        if m:
            by_op[m.group(2)] += n
            total += n
    if total:
        print(f"-- executed warp instructions by opcode (total {total:.3g})")
        for op, n in by_op.most_common(20):
            print(f"{op:16s} {n:14.4g} {100 * n / total:6.1f}%")


def stalled_instructions(prefix, count=12):
    """The instructions where the warps' stall samples fall, with each one's main stall reason: a
    barrier that every warp waits at once per block shows up here (H100, 2026-11-23: 21% of the NA 2-D
    forward's samples at the barrier after thread 0's box search)."""
    head, body = source_table(prefix)
    names = {c: i for i, c in enumerate(head)}
    src, exe = names.get("Source"), names.get("Instructions Executed")
    samples = names.get("Warp Stall Sampling (All Samples)")
    if None in (src, exe, samples):
        return
    reasons = [(i, c[len("stall_"):]) for i, c in enumerate(head)
               if c.startswith("stall_") and "Not Issued" not in c]
    found, total = [], 0.0
    for r in body:
        if len(r) <= max(src, exe, samples):
            continue
        n = number(r[samples])
        if not n:
            continue
        total += n
        top = max(reasons, key=lambda x: number(r[x[0]]) or 0.0)[1] if reasons else "?"
        found.append((n, r[names.get("Address", src)][-6:], number(r[exe]) or 0.0, top, r[src].strip()))
    if total:
        print(f"-- instructions with the most stall samples (of {total:.0f})")
        for n, address, executed, top, text in sorted(found, reverse=True)[:count]:
            print(f"{address:>6s} {100 * n / total:5.1f}%  executed {executed:10.0f}  {top:16s} {text[:60]}")


def launched_warps(prefix):
    """Warps of the profiled launch (Launch Statistics: threads / 32), or None."""
    table = rows(prefix + ".details.csv")
    if not table:
        return None
    head = table[0]
    name, value = head.index("Metric Name"), head.index("Metric Value")
    for r in table[1:]:
        if len(r) > value and r[name] == "Threads":
            threads = number(r[value])
            return threads / 32 if threads else None
    return None


def per_warp_frequency(prefix):
    """Samples and instructions split by how often each warp runs an instruction: once (a block's
    set-up and epilogue), two or three times (a pipeline's first stages), more (the loop). On an
    H200 (2026-11-26) the NA 2-D K13 forward had 40% of its samples in code run once a warp."""
    warps = launched_warps(prefix)
    head, body = source_table(prefix)
    names = {c: i for i, c in enumerate(head)}
    exe, samples = names.get("Instructions Executed"), names.get("Warp Stall Sampling (All Samples)")
    if not warps or None in (exe, samples):
        return
    classes = collections.OrderedDict((k, [0.0, 0.0]) for k in ("once", "2-3 times", "loop"))
    for r in body:
        if len(r) <= max(exe, samples):
            continue
        executed, sampled = number(r[exe]) or 0.0, number(r[samples]) or 0.0
        if not executed and not sampled:
            continue
        per_warp = executed / warps
        key = "once" if per_warp <= 1.01 else ("2-3 times" if per_warp <= 3.01 else "loop")
        classes[key][0] += sampled
        classes[key][1] += executed
    total_samples = sum(v[0] for v in classes.values())
    total_executed = sum(v[1] for v in classes.values())
    if total_samples and total_executed:
        print(f"-- by how often a warp runs the code ({warps:.0f} warps)")
        for key, (sampled, executed) in classes.items():
            print(f"{key:16s} samples {100 * sampled / total_samples:5.1f}%  "
                  f"instructions {100 * executed / total_executed:5.1f}%")


if __name__ == "__main__":
    prefix = sys.argv[1]
    print(f"== {prefix}")
    details(prefix)
    stalls(prefix)
    instruction_mix(prefix)
    stalled_instructions(prefix)
    per_warp_frequency(prefix)
