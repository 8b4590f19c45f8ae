"""`golden check`: golden/ on disk against freshly generated cases and file bytes, field by field."""
from __future__ import annotations

import hashlib
import sys

from ...conformance.golden_format import (COMPONENT_FILES, GoldenCase, _root, case_arrays as _case_arrays,
                                       diff_arrays, file_arrays as _file_arrays, load_manifest)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

def _diff_entries(file: str, golden: list, fresh: list) -> list[str]:
    """Component vectors: entries matched by id, every key compared; hex lists element by element."""
    out = []
    g_by = {e.get("id"): e for e in golden}
    f_by = {e.get("id"): e for e in fresh}
    for i in f_by.keys() - g_by.keys():
        out.append(f"{i}: missing from golden {file}")
    for i in g_by.keys() - f_by.keys():
        out.append(f"{i}: in golden {file} but not regenerated")
    for i in f_by.keys() & g_by.keys():
        g, f = g_by[i], f_by[i]
        for k in sorted(set(g) | set(f)):
            gv, fv = g.get(k), f.get(k)
            if gv == fv:
                continue
            if (isinstance(gv, list) and isinstance(fv, list) and len(gv) == len(fv)
                    and all(isinstance(v, str) and v.startswith("0x") for v in gv + fv)):
                j = next(j for j in range(len(gv)) if gv[j] != fv[j])
                x = int(gv[j], 16) ^ int(fv[j], 16)
                out.append(f"{i} {k}: first difference at index {j}: golden {gv[j]}, regenerated {fv[j]}, "
                           f"xor 0x{x:X} ({bin(x).count('1')} bit(s))")
            else:
                out.append(f"{i} {k}: golden {gv!r} vs regenerated {fv!r}")
    return out


def compare(root, cases: list[GoldenCase], files: dict[str, bytes]) -> list[str]:
    """Problems found comparing golden/ at `root` with freshly generated cases and file bytes."""
    root = _root(root)
    problems: list[str] = []
    try:
        man = load_manifest(root)
    except (OSError, tomllib.TOMLDecodeError) as e:
        return [f"manifest.toml: cannot read ({e})"]
    fresh_man = tomllib.loads(files["manifest.toml"].decode())
    problems += _manifest_problems(root, man, fresh_man, files)
    problems += _case_data_problems(root, cases)
    problems += _component_problems(root, files)
    # anything else (formatting, comments): byte comparison, reported only if nothing finer was found
    if not problems:
        for f, data in files.items():
            p = root / f
            if p.is_file() and p.read_bytes() != data:
                problems.append(f"{f}: bytes differ from the regenerated file (formatting or order)")
    return problems


def _manifest_problems(root, man: dict, fresh_man: dict, files: dict[str, bytes]) -> list[str]:
    """Versions, the file list and each file's sha256, case and attention entries of the manifest."""
    problems: list[str] = []
    for k in ("spec_version", "generator_version"):
        if man.get(k) != fresh_man[k]:
            problems.append(f"manifest.toml {k}: golden {man.get(k)!r} vs regenerated {fresh_man[k]!r}")
    # files and their sha256
    on_disk = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    for f in sorted(set(files) - on_disk):
        problems.append(f"{f}: missing from {root}")
    for f in sorted(on_disk - set(files)):
        problems.append(f"{f}: not produced by the generator (stale file?)")
    for f, meta in sorted(man.get("files", {}).items()):
        p = root / f
        if p.is_file() and hashlib.sha256(p.read_bytes()).hexdigest() != meta.get("sha256"):
            problems.append(f"{f}: sha256 does not match the manifest")
    # case metadata
    g_entries = {e["id"]: e for e in man.get("case", [])}
    f_entries = {e["id"]: e for e in fresh_man.get("case", [])}
    for i in f_entries.keys() - g_entries.keys():
        problems.append(f"{i}: missing from the golden manifest")
    for i in g_entries.keys() - f_entries.keys():
        problems.append(f"{i}: in the golden manifest but not regenerated")
    for i in sorted(f_entries.keys() & g_entries.keys()):
        for k in sorted(set(f_entries[i]) | set(g_entries[i])):
            if f_entries[i].get(k) != g_entries[i].get(k):
                problems.append(f"{i} {k}: golden {g_entries[i].get(k)!r} vs regenerated {f_entries[i].get(k)!r}")
    # attention cases (spec 1.2): manifest entries; their npz is compared byte for byte below
    g_att = {e["id"]: e for e in man.get("attention", [])}
    f_att = {e["id"]: e for e in fresh_man.get("attention", [])}
    for i in sorted(g_att.keys() ^ f_att.keys()):
        problems.append(f"{i}: attention case {'not regenerated' if i in g_att else 'missing from the manifest'}")
    for i in sorted(g_att.keys() & f_att.keys()):
        if g_att[i] != f_att[i]:
            problems.append(f"{i}: attention manifest entry differs from the regenerated one")
    return problems


def _case_data_problems(root, cases: list[GoldenCase]) -> list[str]:
    """Each case's arrays on disk against the regenerated ones, field by field."""
    problems: list[str] = []
    disk_arrays: dict[str, dict] = {}
    for c in cases:
        if c.file not in disk_arrays:
            try:
                disk_arrays[c.file] = _file_arrays(root / c.file)
            except Exception as e:  # noqa: BLE001 - a damaged file is a finding, not a crash
                disk_arrays[c.file] = {}
                problems.append(f"{c.file}: cannot read ({type(e).__name__}: {e})")
                continue
        got = disk_arrays[c.file].get(c.id)
        if got is None:
            if disk_arrays[c.file] or (root / c.file).is_file():
                problems.append(f"{c.id}: no data in {c.file}")
            continue
        want = _case_arrays(c)
        for k in sorted(set(want) | set(got)):
            if k not in got or k not in want:
                problems.append(f"{c.id} {k}: field {'missing from golden' if k not in got else 'not regenerated'}")
                continue
            msg = diff_arrays(f"{c.id} {k}", got[k], want[k])
            if msg:
                problems.append(msg)
    return problems


def _component_problems(root, files: dict[str, bytes]) -> list[str]:
    """The component vector files, entry by entry."""
    problems: list[str] = []
    for name in COMPONENT_FILES:
        rel = f"cases/{name}.toml"
        try:
            g = tomllib.loads((root / rel).read_bytes().decode())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            problems.append(f"{rel}: cannot read ({type(e).__name__}: {e})")
            continue
        fr = tomllib.loads(files[rel].decode())
        for section in sorted(set(g) | set(fr)):
            problems += _diff_entries(rel, g.get(section, []), fr.get(section, []))
    return problems

