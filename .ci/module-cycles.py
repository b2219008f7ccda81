#!/usr/bin/env python3
"""Fails if the modules of any crate import each other in a loop.

For each crate under crates/, every file src/NAME.rs is module NAME. An edge
A -> B is drawn when A names `crate::B`, `super::B`, or an item that lib.rs
re-exports from B (`pub use B::Item`). lib.rs and main.rs are the crate's
root and take no part. Prints every cycle (strongly connected component of
two or more modules, or a module that imports itself) and exits 1 if any.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def use_targets(text):
    """Yield the first path segment after `crate::`/`super::`, expanding braces."""
    for m in re.finditer(r"\b(?:crate|super)::(\{[^;]*?\}|\w+)", text, flags=re.S):
        seg = m.group(1)
        if seg.startswith("{"):
            depth, tok, names = 0, "", []
            for ch in seg[1:-1]:
                if ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                elif ch == "," and depth == 0:
                    names.append(tok)
                    tok = ""
                    continue
                tok += ch if depth == 0 else ""
            names.append(tok)
            for n in names:
                head = re.match(r"\s*(\w+)", n)
                if head:
                    yield head.group(1)
        else:
            yield seg


def crate_cycles(src):
    mods = {p.stem: p for p in src.glob("*.rs") if p.stem not in ("lib", "main")}
    reexport = {}
    lib = src / "lib.rs"
    if lib.exists():
        for m in re.finditer(r"pub\s+use\s+(\w+)::(\{[^;]*\}|\w+)", strip_comments(lib.read_text())):
            if m.group(1) in mods:
                for item in re.findall(r"\w+", m.group(2)):
                    reexport.setdefault(item, m.group(1))
    edges = {}
    for name, path in mods.items():
        out = set()
        for seg in use_targets(strip_comments(path.read_text())):
            target = seg if seg in mods else reexport.get(seg)
            if target and target != name:
                out.add(target)
        edges[name] = out
    # Tarjan's strongly connected components.
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return comps, edges


def main():
    found = 0
    for src in sorted(ROOT.glob("crates/*/src")):
        comps, edges = crate_cycles(src)
        for comp in comps:
            found += 1
            print(f"cycle in {src.parent.name}: {' <-> '.join(comp)}")
            for a in comp:
                for b in sorted(edges[a] & set(comp)):
                    print(f"  {a}.rs -> {b}.rs")
    if found:
        sys.exit(1)
    print("no module cycles")


if __name__ == "__main__":
    main()
