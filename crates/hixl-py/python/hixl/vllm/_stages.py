"""Pipeline parallelism: which prefill stage holds which of a decode worker's layers. Plain data
only (no vLLM), so it is tested without it.

Each worker advertises, per KV cache group, its first registered layer and the model's layer
index of each of its layers (``layers``: ``[[first, [global index, ...]], ...]``). A prefill of
PP size ``S`` hands the decode ``S × TP`` ranks, stage-major; the decode pulls each of its
layers from the stage that holds it, each run of layers consecutive on both sides as one layer
range, and ends each stage's leases once."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

#: per KV cache group: (first registered layer, global layer index of each)
Layers = List[Tuple[int, List[int]]]


def layer_runs(src: Tuple[int, Sequence[int]],
               dst: Tuple[int, Sequence[int]]) -> List[Tuple[range, range]]:
    """The (source layer range, destination layer range) pairs, in registered layers, that
    move the layers both hold of one group: runs consecutive on both sides."""
    (sf, sids), (df, dids) = src, dst
    at = {int(x): i for i, x in enumerate(sids)}
    out: List[Tuple[range, range]] = []
    for j, x in enumerate(dids):
        i = at.get(int(x))
        if i is None:
            continue
        if out and out[-1][0].stop == sf + i and out[-1][1].stop == df + j:
            s, d = out[-1]
            out[-1] = (range(s.start, s.stop + 1), range(d.start, d.stop + 1))
        else:
            out.append((range(sf + i, sf + i + 1), range(df + j, df + j + 1)))
    return out


def stages(h: Dict[str, Any]) -> List[Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]]:
    """The prefill's (ranks, grants) per PP stage, each a TP group (stage-major)."""
    tp = int(h.get("tp_size", 1))
    pp = int(h.get("pp_size", 1))
    ranks, grants = h["ranks"], h["grants"]
    if len(ranks) != tp * pp or len(grants) != tp * pp:
        raise ValueError(f"{len(ranks)} prefill ranks and {len(grants)} grants for PP {pp} x "
                         f"TP {tp}")
    return [(ranks[s * tp:(s + 1) * tp], grants[s * tp:(s + 1) * tp]) for s in range(pp)]


def uncovered(mine: Layers, held: Sequence[Layers]) -> Optional[str]:
    """Why the prefill stages ``held`` cannot give this worker its layers ``mine`` (a layer
    no stage holds, a group count that differs, a stage read only in part), or ``None``."""
    for s, layers in enumerate(held):
        if len(layers) != len(mine):
            return (f"prefill stage {s} has {len(layers)} KV cache groups, this decode "
                    f"{len(mine)}")
    for g, (_, ids) in enumerate(mine):
        have = {int(x) for layers in held for x in layers[g][1]}
        lost = sorted(set(int(x) for x in ids) - have)
        if lost:
            return f"no prefill stage holds layers {lost} of KV cache group {g}"
    for s, layers in enumerate(held):
        part = [(g, sorted(set(ids) - {int(x) for x in mine[g][1]}))
                for g, (_, ids) in enumerate(layers)
                if set(ids) & {int(x) for x in mine[g][1]}]
        extra = [(g, x) for g, x in part if x]
        if extra:
            # Another decode stage reads the rest of this stage's lease: reading one lease
            # from several decode stages is not supported yet.
            return (f"prefill stage {s} holds layers {extra[0][1]} of KV cache group "
                    f"{extra[0][0]} that this decode stage does not: a prefill stage read by "
                    f"several decode stages is not supported")
    return None
