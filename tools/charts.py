#!/usr/bin/env python3
"""Draws docs/benchmarks.md's charts (SVG, into docs/charts/) from the figures they came from
(docs/data/*.json, the medians the page's tables give): GB/s by case per transport beside the
best peer and the same-run memcpy, the vLLM TTFT comparison, and verbs beside perftest.

    python3 tools/charts.py [docs/data/results-2026-12.json]     # needs matplotlib

The SVGs are committed with their data; run this again when the data changes.
"""

import json
import sys
from pathlib import Path
from typing import Any, Dict, List

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "charts"
plt.rcParams["svg.hashsalt"] = "hixl"  # stable ids: a redraw of the same data is the same file
plt.rcParams["svg.fonttype"] = "none"


def bars(ax: Any, labels: List[str], series: Dict[str, List[float]], unit: str) -> None:
    n = len(series)
    width = 0.8 / n
    for i, (name, vals) in enumerate(series.items()):
        xs = [x + (i - (n - 1) / 2) * width for x in range(len(labels))]
        b = ax.bar(xs, vals, width, label=name)
        ax.bar_label(b, fmt="%.3g", fontsize=7, padding=1)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel(unit)
    ax.legend(fontsize=8, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)


def comm(d: Dict[str, Any]) -> None:
    for transport in ("tcp", "fabric"):
        cases = [c for c in d["cases"] if c["transport"] == transport]
        labels = [f"{c['op']}\n{c['block']} x {c['batch']}" for c in cases]
        peers = sorted({c["peer_name"] for c in cases})
        series = {"hixl": [c["hixl"] for c in cases],
                  f"best peer ({', '.join(peers)})": [c["peer"] for c in cases]}
        fig, ax = plt.subplots(figsize=(9, 3.6))
        bars(ax, labels, series, "GB/s")
        if transport == "fabric":
            ax.axhline(d["memcpy_1m_gbps_median"], color="grey", linestyle="--", linewidth=1)
            ax.text(len(labels) - 0.5, d["memcpy_1m_gbps_median"], " hot memcpy of 1 MiB",
                    fontsize=7, va="bottom", ha="right", color="grey")
        ax.set_title(f"{transport}: GB/s per call of batch x block, two processes (higher is better)",
                     fontsize=9)
        fig.tight_layout()
        fig.savefig(OUT / f"comm-{transport}.svg")
        plt.close(fig)


def vllm(d: Dict[str, Any]) -> None:
    fig, ax = plt.subplots(figsize=(8, 3.4))
    conns = d["connectors"]
    series = {name: vals for name, vals in conns.items()}
    bars(ax, d["metrics"], series, "ms")
    ax.set_title("vLLM prefill/decode, medians (lower is better)", fontsize=9)
    fig.tight_layout()
    fig.savefig(OUT / "vllm-ttft.svg")
    plt.close(fig)


def verbs(d: Dict[str, Any]) -> None:
    mean = lambda runs: [sum(r) / len(r) for r in runs]  # noqa: E731
    series = {"ib_write_bw / ib_read_bw (1 QP)": mean(d["perftest"]),
              "hixl, 1 rail": mean(d["hixl_1_rail"]),
              "hixl, 2 rails": mean(d["hixl_2_rails"])}
    fig, ax = plt.subplots(figsize=(8, 3.4))
    bars(ax, d["cases"], series, "MB/s")
    ax.set_title("verbs in the Soft-RoCE guest (TCG, CPU-bound: compares costs, not NICs)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(OUT / "verbs-softroce.svg")
    plt.close(fig)


def main() -> None:
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "data" / "results-2026-12.json"
    data = json.loads(src.read_text())
    OUT.mkdir(parents=True, exist_ok=True)
    comm(data["comm"])
    vllm(data["vllm"])
    verbs(data["verbs"])
    print(f"charts: {', '.join(sorted(p.name for p in OUT.glob('*.svg')))} in {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
