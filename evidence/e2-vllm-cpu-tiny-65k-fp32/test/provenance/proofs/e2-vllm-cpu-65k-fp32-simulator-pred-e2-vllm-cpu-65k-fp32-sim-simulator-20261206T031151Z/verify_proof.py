"""Verify a proof that a file is unchanged since its commit, with no git and no project code.

Why standalone: a reviewer must be able to check the chain with nothing but Python's standard
library, so this module imports nothing from the project, and `provenance prove` copies it into
every proof folder as `verify_proof.py` (run `python3 verify_proof.py [--file COPY] [RUN_DIR ...]`
inside the folder).

The chain, from the stored raw git objects (the bytes git hashes, minus the `<type> <size>\\0`
header, which is rebuilt here):

  file bytes --SHA-256--> the file's hash (= the tag message's line for the path, = each run's
  meta.json registration hash) --git hash--> blob id --entry in--> each tree on the path up to the
  root tree --tree line of--> the commit --object line of--> the annotated tag

Every object id is recomputed from its stored bytes with the repository's object format (SHA-1
or SHA-256), and every link is checked. Any altered byte breaks the chain at that object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = "agentload-proof"
_HASHES = {"sha1": (hashlib.sha1, 20), "sha256": (hashlib.sha256, 32)}
_BLOB_MODES = {b"100644", b"100755"}
_TAG_LINE = re.compile(r"^sha256 ([0-9a-f]{64})  (\S.*)$")


@dataclass
class ProofResult:
    """What was checked; `ok` only when every check held."""

    path: str
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    def add(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append((name, bool(ok), detail))
        return bool(ok)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c[1] for c in self.checks)

    @property
    def failures(self) -> list[str]:
        return [f"{n}: {d}" for n, ok, d in self.checks if not ok]

    def text(self) -> str:
        lines = [f"proof of {self.path}: {'VERIFIED' if self.ok else 'BROKEN'}"]
        lines += [f"  [{'ok' if ok else 'BROKEN'}] {n}" + (f": {d}" if d else "") for n, ok, d in self.checks]
        return "\n".join(lines)


def object_id(kind: str, content: bytes, object_format: str) -> str:
    """The git object id of `content` stored as `kind` (blob, tree, commit, tag)."""
    h = _HASHES[object_format][0]()
    h.update(f"{kind} {len(content)}".encode() + b"\0" + content)
    return h.hexdigest()


def parse_tree(content: bytes, object_format: str) -> dict[bytes, tuple[bytes, str]]:
    """{name: (mode, id)} of a raw tree object (entries `<mode> <name>\\0<raw id>`)."""
    n = _HASHES[object_format][1]
    out: dict[bytes, tuple[bytes, str]] = {}
    i = 0
    while i < len(content):
        sp = content.index(b" ", i)
        nul = content.index(b"\0", sp)
        mode, name = content[i:sp], content[sp + 1 : nul]
        oid = content[nul + 1 : nul + 1 + n]
        if len(oid) != n:
            raise ValueError("tree entry cut short")
        out[name] = (mode, oid.hex())
        i = nul + 1 + n
    return out


def _headers(content: bytes) -> tuple[dict[str, str], str]:
    head, _, msg = content.partition(b"\n\n")
    hdr: dict[str, str] = {}
    for line in head.decode("utf-8", "replace").splitlines():
        if line.startswith(" "):
            continue  # continuation (e.g. a signature)
        k, _, v = line.partition(" ")
        hdr.setdefault(k, v)
    return hdr, msg.decode("utf-8", "replace")


def tag_message_hashes(msg: str) -> dict[str, str]:
    """{path: sha256} from a freeze tag's message (its `sha256 <hex>  <path>` lines; written by
    prereg.freeze.tag_message). The one parser of those lines: freezing reads them back with it too."""
    out: dict[str, str] = {}
    for line in msg.splitlines():
        m = _TAG_LINE.match(line.rstrip("\r"))
        if m:
            out[m.group(2)] = m.group(1)
    return out


def verify_proof(
    folder: str | Path, file_copy: str | Path | None = None, run_dirs: list[str | Path] | None = None
) -> ProofResult:
    """Check a proof folder (see the module doc). `file_copy`: a copy to check byte identity of
    (e.g. the file in a public repository); `run_dirs`: runs whose meta.json must carry the hash."""
    d = Path(folder)
    try:
        man = json.loads((d / "proof.json").read_text())
    except (OSError, ValueError) as exc:
        res = ProofResult(str(d))
        res.add("proof.json readable", False, str(exc))
        return res
    res = ProofResult(str(man.get("path", d)))
    if man.get("format") != FORMAT or man.get("object_format") not in _HASHES:
        res.add("proof format", False, f"format {man.get('format')!r}, object_format {man.get('object_format')!r}")
        return res
    fmt = man["object_format"]
    objects: dict[str, tuple[str, bytes]] = {}
    for oid, kind in man["objects"].items():
        p = d / "objects" / oid
        try:
            content = p.read_bytes()
        except OSError:
            res.add(f"{kind} {oid[:12]} stored", False, f"objects/{oid} missing")
            continue
        got = object_id(kind, content, fmt)
        res.add(
            f"{kind} {oid[:12]} id recomputed ({fmt})", got == oid, "" if got == oid else f"stored bytes hash to {got}"
        )
        objects[oid] = (kind, content)
    blob = objects.get(man["blob"], ("", b""))[1]
    fsha = hashlib.sha256(blob).hexdigest()
    res.add("file SHA-256 of the blob's bytes", fsha == man["file_sha256"], f"{fsha} vs recorded {man['file_sha256']}")
    # commit -> root tree
    ckind, ccontent = objects.get(man["commit"], ("", b""))
    chdr, _ = _headers(ccontent)
    trees = man["trees"]
    res.add(
        "commit names the root tree",
        ckind == "commit" and chdr.get("tree") == trees[0]["id"],
        f"commit tree {chdr.get('tree')} vs {trees[0]['id']}",
    )
    # trees along the path -> blob
    parts = man["path"].split("/")
    for i, part in enumerate(parts):
        kind, content = objects.get(trees[i]["id"], ("", b""))
        try:
            entries = parse_tree(content, fmt) if kind == "tree" else {}
        except ValueError as exc:
            res.add(f"tree {trees[i]['path'] or '/'} parses", False, str(exc))
            break
        ent = entries.get(part.encode())
        last = i == len(parts) - 1
        want = man["blob"] if last else trees[i + 1]["id"]
        mode_ok = ent is not None and ((ent[0] in _BLOB_MODES) if last else ent[0] == b"40000")
        res.add(
            f"tree {trees[i]['path'] or '/'} holds {part!r}",
            ent is not None and ent[1] == want and mode_ok,
            f"entry {ent[0].decode() + ' ' + ent[1] if ent else 'absent'}, expected {want}",
        )
    # tag -> commit, and the tag message's hash for the path
    tag = man.get("tag")
    if tag:
        tkind, tcontent = objects.get(tag["id"], ("", b""))
        thdr, tmsg = _headers(tcontent)
        res.add(
            "tag points to the commit",
            tkind == "tag" and thdr.get("object") == man["commit"] and thdr.get("type") == "commit",
            f"tag object line {thdr.get('object')} ({thdr.get('type')})",
        )
        res.add("tag name", thdr.get("tag") == tag["name"], f"{thdr.get('tag')!r} vs {tag['name']!r}")
        listed = tag_message_hashes(tmsg).get(man["path"])
        res.add(
            "tag message states the file's SHA-256", listed == fsha, f"tag says {listed}, the blob hashes to {fsha}"
        )
    if file_copy is not None:
        try:
            csha = hashlib.sha256(Path(file_copy).read_bytes()).hexdigest()
        except OSError as exc:
            csha = f"unreadable ({exc})"
        res.add(f"copy {file_copy} byte-identical", csha == fsha, f"{csha} vs {fsha}")
    for rd in run_dirs or []:
        try:
            meta = json.loads((Path(rd) / "meta.json").read_text())
        except (OSError, ValueError) as exc:
            res.add(f"run {Path(rd).name} meta.json", False, str(exc))
            continue
        reg = meta.get("registration") if isinstance(meta.get("registration"), dict) else {}
        res.add(
            f"run {Path(rd).name} meta.json carries the file's SHA-256",
            reg.get("sha256") == fsha,
            f"meta.json registration sha256 {reg.get('sha256')}",
        )
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="verify a file-unchanged-since-commit proof with no git")
    ap.add_argument("runs", nargs="*", help="run directories whose meta.json must carry the file's SHA-256")
    ap.add_argument("--dir", default=str(Path(__file__).resolve().parent), help="proof folder (default: this script's)")
    ap.add_argument("--file", help="a copy of the file to check byte identity of")
    a = ap.parse_args(argv)
    res = verify_proof(a.dir, a.file, a.runs)
    print(res.text())
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
