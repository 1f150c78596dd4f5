#!/usr/bin/env python3
"""Pairs of files of one crate's src/ that import each other (by `crate::`, `super::` and
`self::` paths), a finer check than module cycles. A child module's `super::` paths to the
parent that declares it are not counted (a file of `impl Parent` blocks is the parent's).
Usage: filecycles.py CRATE_SRC_DIR... Prints each pair; exits 1 if any."""
import os
import re
import sys


def modules(src):
    mods = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            p = os.path.join(root, f)
            parts = os.path.relpath(p, src)[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            mods[p] = parts
    # `#[path = "x.rs"] mod name;` puts x.rs at parent::name.
    for p in list(mods):
        text = open(p, encoding="utf-8", errors="replace").read()
        for m in re.finditer(r'#\[path\s*=\s*"([^"]+)"\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)', text):
            target = os.path.normpath(os.path.join(os.path.dirname(p), m.group(1)))
            if target in mods:
                base = mods[p] if os.path.basename(p) in ("mod.rs", "lib.rs", "main.rs") else mods[p][:-1] + [mods[p][-1]]
                mods[target] = base + [m.group(2)]
    return mods


def check(src):
    mods = modules(src)
    by_path = {"::".join(v): k for k, v in mods.items()}
    edges = {p: set() for p in mods}
    for p, me in mods.items():
        text = open(p, encoding="utf-8", errors="replace").read()
        text = re.sub(r"#\[cfg\(test\)\]\s*mod tests\s*\{.*", "", text, flags=re.S)
        text = re.sub(r"//[^\n]*", "", text)
        # `use a::{b, c::d}` groups are flattened to their prefixes; enough to find the files.
        for hit in re.finditer(r"\b(crate|super|self)((?:::\w+)+)", text):
            segs = hit.group(2).strip(":").split("::")
            # A call (`super::connect(...)`) names a function, not a module of that name.
            if text[hit.end():hit.end() + 1] in ("(", "!"):
                segs = segs[:-1]
            if hit.group(1) == "crate":
                base = []
            else:
                base = list(me)
                if hit.group(1) == "super":
                    # `super` of a file module is its parent; chained supers are in segs.
                    base = base[:-1]
                while segs and segs[0] == "super":
                    base = base[:-1]
                    segs = segs[1:]
            path = base + segs
            for i in range(len(path), -1, -1):
                t = by_path.get("::".join(path[:i]))
                if t is not None:
                    child_to_parent = mods[t] == me[:-1] and os.path.basename(t) in ("mod.rs", "lib.rs", "main.rs")
                    if t != p and not child_to_parent:
                        edges[p].add(t)
                    break
    pairs = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if a in edges.get(b, ())})
    for a, b in pairs:
        print(f"mutual: {os.path.relpath(a, src)} <-> {os.path.relpath(b, src)}")
    return pairs


found = []
for src in sys.argv[1:]:
    found += check(src)
print(f"{len(found)} pair(s) of files importing each other")
sys.exit(1 if found else 0)
