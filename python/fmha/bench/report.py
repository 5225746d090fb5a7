"""Results: ratios to the best peer, the console table, JSON, a markdown report and PNG plots."""
from __future__ import annotations

import json
import os
import re
from collections import OrderedDict

FLOP_CONVENTION = ("FLOPs count visible (query, key) pairs only: forward = 2 * pairs * (D + Dv); "
                   "backward = 2.5 x forward by convention; fwd+bwd = 3.5 x forward.")


BYTES_CONVENTION = ("decode: TB/s = (every key and value of the cache read once + the queries "
                    "read and the output written once) / median time; a paged cache counts the "
                    "same bytes as the contiguous one.")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def add_ratios(records: list, copy_tbps=None) -> None:
    """Sets vs_best_peer = TFLOP/s / best peer TFLOP/s (same case and direction) on timed rows,
    and of_copy = TB/s / the card's copy bandwidth on rows that carry TB/s when it was measured."""
    if copy_tbps:
        for r in records:
            if r["status"] == "ok" and r.get("tbps"):
                r["of_copy"] = r["tbps"] / copy_tbps
    best = {}
    for r in records:
        if r["is_peer"] and r["status"] == "ok" and r.get("tflops"):
            key = (r["case"], r["direction"])
            if key not in best or r["tflops"] > best[key][0]:
                best[key] = (r["tflops"], r["impl"])
    for r in records:
        key = (r["case"], r["direction"])
        if r["status"] == "ok" and r.get("tflops") and key in best:
            r["vs_best_peer"] = r["tflops"] / best[key][0]
            r["best_peer"] = best[key][1]


def _check_text(r: dict) -> str:
    if r.get("check_error") is None:
        return "-"
    text = f"{r['check_error']:.1e}"
    if r.get("check_ok") is False:
        text = f"FAIL {text} ({r['check_tensor']})"
    return text


def _row(r: dict, memory: bool) -> list:
    if r["status"] != "ok":
        label = "FAIL" if r["status"] == "fail" else "n/a"
        return [r["case"], r["impl"], r["direction"], f"{label}: {r['reason']}"]
    if memory:
        return [r["case"], r["impl"], r["direction"], f"{r['peak_extra_bytes'] / 2**20:.1f}",
                _check_text(r)]
    ratio = f"{r['vs_best_peer']:.2f}x" if r.get("vs_best_peer") else "-"
    rate = f"{r['tflops']:.3g}"
    if r.get("tbps") is not None:  # decode: bytes a second, and the share of the copy bandwidth
        rate = f"{r['tbps']:.3g}" + (f" ({r['of_copy']:.0%})" if r.get("of_copy") else "")
    return [r["case"], r["impl"], r["direction"], f"{r['median_ms']:.3f}",
            f"{r['p10_ms']:.3f}-{r['p90_ms']:.3f}", rate, ratio, _check_text(r)]


def _is_bandwidth(records: list) -> bool:
    """Whether the records are decode rows, rated in TB/s rather than TFLOP/s."""
    return any(r.get("bytes") for r in records)


def _headers(memory: bool, bandwidth: bool = False) -> list:
    if memory:
        return ["case", "impl", "dir", "peak extra MiB", "check"]
    rate = "TB/s (of copy)" if bandwidth else "TFLOP/s"
    return ["case", "impl", "dir", "median ms", "p10-p90 ms", rate, "vs best peer", "check"]


def _collapse(records: list) -> list:
    """One row "all" for an implementation that is n/a in every direction for the same reason."""
    out, i = [], 0
    while i < len(records):
        r = records[i]
        j = i
        while (j + 1 < len(records) and records[j + 1]["case"] == r["case"]
               and records[j + 1]["impl"] == r["impl"]):
            j += 1
        same = records[i:j + 1]
        if len(same) > 1 and all(x["status"] == r["status"] != "ok" and x["reason"] == r["reason"]
                                 for x in same):
            out.append(dict(r, direction="all"))
        else:
            out += same
        i = j + 1
    return out


def format_table(records: list, memory: bool, reason_width: int = 70) -> str:
    """Fixed-width text table; n/a rows carry their reason in place of the numbers."""
    headers = _headers(memory, _is_bandwidth(records))
    rows = [_row(r, memory) for r in _collapse(records)]
    widths = [len(h) for h in headers]
    for row in rows:
        if len(row) == len(headers):
            widths = [max(w, len(c)) for w, c in zip(widths, row)]
        else:
            widths[:3] = [max(w, len(c)) for w, c in zip(widths[:3], row[:3])]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths))]
    lines.append("  ".join("-" * w for w in widths))
    previous = None
    for row in rows:
        if previous is not None and row[0] != previous:
            lines.append("")
        previous = row[0]
        if len(row) == len(headers):
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        else:
            head = "  ".join(c.ljust(w) for c, w in zip(row[:3], widths[:3]))
            lines.append(f"{head}  {row[3][:reason_width]}")
    return "\n".join(lines)


def format_summary(records: list, memory: bool) -> str:
    """One line per (case, direction) and fmha implementation: fmha against the best peer (fastest,
    or least memory). With several fmha implementations (--backward-impl both) each line names
    its own."""
    bandwidth = _is_bandwidth(records)
    key = "peak_extra_bytes" if memory else "tbps" if bandwidth else "tflops"
    lines = []
    width = max([len(r["case"]) for r in records] + [4])
    named = len({r["impl"] for r in records if not r["is_peer"]}) > 1
    ours_width = 26 if named else 12
    unit = "MiB" if memory else "TB/s" if bandwidth else "TFLOP/s"
    ratio_name = "peer/fmha" if memory else "fmha/peer"
    lines.append(f"{'case'.ljust(width)}  {'dir':<7}  {'fmha ' + unit:<{ours_width}} "
                 f"{'best peer ' + unit:<26} {ratio_name:<9}  check")
    groups = OrderedDict()
    for r in records:
        groups.setdefault((r["case"], r["direction"]), []).append(r)
    for (case, direction), rows in groups.items():
        peers = [r for r in rows if r["is_peer"] and r["status"] == "ok" and r.get(key)]
        best = (min if memory else max)(peers, key=lambda r: r[key]) if peers else None
        scale = 2**20 if memory else 1.0

        def value(r):
            return f"{r[key] / scale:.3g}" if r is not None and r["status"] == "ok" else "n/a"
        peer_text = f"{value(best)} {best['impl']}" if best else "n/a"
        for ours in [r for r in rows if not r["is_peer"]] or [None]:
            ours_text = f"{value(ours)} {ours['impl']}" if named and ours else value(ours)
            ratio = "-"
            if best and ours is not None and ours["status"] == "ok":
                ratio = f"{(best[key] / ours[key]) if memory else (ours[key] / best[key]):.2f}x"
            status = ""
            if ours is not None and ours["status"] != "ok":
                status = f"{'FAIL' if ours['status'] == 'fail' else 'n/a'}: {ours['reason'][:60]}"
            elif ours is not None:
                status = _check_text(ours)
            lines.append(f"{case.ljust(width)}  {direction:<7}  {ours_text:<{ours_width}} "
                         f"{peer_text:<26} {ratio:<9}  {status}")
    return "\n".join(lines)


def write_json(path: str, meta: dict, records: list) -> None:
    with open(path, "w") as f:
        json.dump({"meta": meta, "records": records}, f, indent=1, default=str)


def write_markdown(path: str, meta: dict, records: list, memory: bool, plots: list) -> None:
    lines = [f"# fmha benchmark: {meta['suite']} suite on {meta['device_name']}", ""]
    for key in ("device_name", "torch_version", "cuda_version", "fmha_version", "fmha_cpu_isa",
                "command", "date_utc", "timing", "flex", "check"):
        if key == "fmha_cpu_isa" and key not in meta:
            continue
        lines.append(f"- **{key.replace('_', ' ')}**: `{meta.get(key)}`" if key == "command"
                     else f"- **{key.replace('_', ' ')}**: {meta.get(key)}")
    lines.append(f"- **FLOPs**: {FLOP_CONVENTION}")
    if meta.get("bytes"):
        lines.append(f"- **bytes**: {meta['bytes']}")
    if meta.get("copy_bandwidth_tbps"):
        lines.append(f"- **copy bandwidth**: {meta['copy_bandwidth_tbps']:.2f} TB/s (a 1 GiB "
                     "device-to-device copy, bytes read + written; the TB/s column's percentages)")
    lines.append("")
    headers = _headers(memory, _is_bandwidth(records))
    lines.append("| " + " | ".join(headers) + " |")
    lines.append("|" + "|".join("---" for _ in headers) + "|")
    for r in _collapse(records):
        row = _row(r, memory)
        if len(row) < len(headers):
            row = row[:3] + [row[3].replace("|", "/")] + [""] * (len(headers) - 4)
        lines.append("| " + " | ".join(row) + " |")
    if plots:
        lines.append("")
        lines += [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in plots]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def _series(records: list, value_key: str) -> OrderedDict:
    """group -> impl -> sorted [(seq_len, value)] over ok records that carry value_key."""
    groups = OrderedDict()
    for r in records:
        if r["status"] != "ok" or r.get(value_key) is None or not r.get("group"):
            continue
        groups.setdefault(r["group"], OrderedDict()).setdefault(r["impl"], []).append(
            (r["seq_len"], r[value_key]))
    for impls in groups.values():
        for impl in impls:
            impls[impl].sort()
    return groups


def write_plots(out_dir: str, suite: str, meta: dict, records: list, memory: bool) -> list:
    """TFLOP/s (or peak memory) against sequence length, one panel per group, one line per
    implementation; returns the written paths (none when matplotlib is missing)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    paths = []
    ours = {r["impl"] for r in records if not r["is_peer"]}
    directions = ["fwd+bwd"] if memory else ["fwd", "bwd", "fwd+bwd"]
    for direction in directions:
        subset = [r for r in records if r["direction"] == direction]
        groups = _series(subset, "peak_extra_bytes" if memory else "tflops")
        groups = OrderedDict((g, s) for g, s in groups.items()
                             if any(len(points) > 1 for points in s.values()))
        if not groups:
            continue
        cols = min(len(groups), 2)
        rows = (len(groups) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.2 * rows), squeeze=False)
        for ax, (group, series) in zip(axes.flat, groups.items()):
            for impl, points in series.items():
                xs = [p[0] for p in points]
                ys = [p[1] / 2**30 if memory else p[1] for p in points]
                ax.plot(xs, ys, marker="o", linewidth=2.5 if impl in ours else 1.2, label=impl)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("sequence length (tokens)")
            if memory:
                ax.set_yscale("log")
                ax.set_ylabel("peak extra memory, fwd+bwd (GiB)")
            else:
                ax.set_ylabel(f"{direction} TFLOP/s (visible entries)")
            ax.set_title(group)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        for ax in list(axes.flat)[len(groups):]:
            ax.axis("off")
        what = "peak memory" if memory else direction
        fig.suptitle(f"fmha {suite} suite, {what}: {meta['device_name']} "
                     f"(torch {meta['torch_version']})")
        fig.tight_layout()
        path = os.path.join(out_dir, f"{suite}_{'peak' if memory else slug(direction)}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
