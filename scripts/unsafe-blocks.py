#!/usr/bin/env python3
"""Every `unsafe` block, `unsafe fn` and `unsafe impl` in the crate's sources, with its guard.

    scripts/unsafe-blocks.py [ROOT...]        (default: the src/ of every crate, and python/src)

Prints one row per site: the place, the kind, the code on that line and the first sentence of
the `SAFETY:` comment above it (the guard the site rests on), as a Markdown table. Exits 1 when
a site has no `SAFETY:` comment (or, for an `unsafe fn`, no `# Safety` section), so the list
is complete by construction.
"""
import pathlib
import re
import sys

SITE = re.compile(r"\bunsafe\s*(\{|fn\b|impl\b)")


def comment_above(lines, i):
    """The `//` comment lines directly above line i (the site's own line included when it
    carries a trailing comment), joined."""
    out = []
    j = i - 1
    while j >= 0:
        t = lines[j].strip()
        if t.startswith("//"):
            out.append(t.lstrip("/").strip())
            j -= 1
        elif t.startswith("#[") or t == "":
            # Attributes (and blank lines between a comment and an attribute) are skipped.
            if t == "" and out:
                break
            j -= 1
        else:
            # A comment may open the statement the block sits in (`let x = unsafe {`).
            break
    return " ".join(reversed(out))


def guard(lines, i, kind):
    text = comment_above(lines, i)
    if kind == "fn":
        # A `# Safety` doc section states the caller's obligations.
        doc = []
        j = i - 1
        while j >= 0 and (lines[j].strip().startswith("///") or lines[j].strip().startswith("#[")):
            doc.append(lines[j].strip().lstrip("/").strip())
            j -= 1
        doc = list(reversed(doc))
        if "# Safety" in doc:
            k = doc.index("# Safety")
            return " ".join(doc[k + 1 :])
    m = re.search(r"SAFETY:(.*)", text)
    if m:
        return m.group(1).strip()
    # A block inside a statement whose comment is a few lines up (`let (a, b) = unsafe {`).
    for back in range(1, 4):
        if i - back < 0:
            break
        t = comment_above(lines, i - back + 1) if back > 1 else ""
        m = re.search(r"SAFETY:(.*)", t)
        if m:
            return m.group(1).strip()
    return None


def main():
    roots = sys.argv[1:] or ["crates/racelab-core/src", "crates/racelab-dist/src", "src", "crates/racelab-cli/src", "python/src"]
    rows, missing = [], []
    for root in roots:
        for path in sorted(pathlib.Path(root).rglob("*.rs")):
            lines = path.read_text().splitlines()
            in_test = False
            for i, line in enumerate(lines):
                code = line.split("//")[0]
                m = SITE.search(code)
                if not m:
                    continue
                kind = {"{": "block", "fn": "fn", "impl": "impl"}[m.group(1)]
                g = guard(lines, i, kind)
                where = f"{path}:{i + 1}"
                rows.append((where, kind, code.strip(), g))
                if g is None:
                    missing.append(where)
    print("| where | kind | code | guard |")
    print("|---|---|---|---|")
    for where, kind, code, g in rows:
        first = (g or "(none)").split(". ")[0].replace("|", "\\|")
        print(f"| `{where}` | {kind} | `{code.replace('|', '/')}` | {first} |")
    print(f"\n{len(rows)} sites, {len(missing)} without a stated guard", file=sys.stderr)
    if missing:
        for w in missing:
            print(f"no SAFETY comment: {w}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
