"""golden/ against the numpy reference: `golden check` passes, fails on a flipped byte naming the case,
the manifest's sha256 values match, and every case is reproduced through the public iter_cases API."""
from __future__ import annotations

import hashlib
import io
import shutil
import zipfile
from contextlib import redirect_stdout

import numpy as np
import pytest

from veloxquant import reference
import veloxquant.reference.stream
from veloxquant.tools import cli, golden


def _run_cli(*argv) -> tuple[int, str]:
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = cli.main(["golden", *argv])
    return rc, buf.getvalue()


def test_check_passes_on_the_repository():
    assert golden.check() == []
    rc, out = _run_cli("check")
    assert rc == 0, out


def test_manifest_sha256_matches_files():
    man = golden.load_manifest()
    assert man["files"], "manifest lists no files"
    on_disk = golden.on_disk_files(golden.ROOT) - {"manifest.toml"}
    assert set(man["files"]) == on_disk
    for rel, meta in man["files"].items():
        data = (golden.ROOT / rel).read_bytes()
        assert hashlib.sha256(data).hexdigest() == meta["sha256"], rel
        assert len(data) == meta["bytes"], rel


@pytest.fixture()
def golden_copy(tmp_path):
    dst = tmp_path / "golden"
    shutil.copytree(golden.ROOT, dst)
    return dst


def _member_data_offset(path, member: str) -> int:
    """Byte offset of an .npy member's array data inside a stored (uncompressed) npz."""
    data = path.read_bytes()
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(member)
        body = z.read(member)
    name_len = int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], "little")
    extra_len = int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
    start = info.header_offset + 30 + name_len + extra_len
    header_len = len(body) - np.load(io.BytesIO(body)).nbytes
    return start + header_len


def test_flipped_byte_in_npz_names_case_and_field(golden_copy):
    case = next(golden.iter_cases(golden_copy, methods=["turboquant"], flags=["random"]))
    path = golden_copy / case.file
    off = _member_data_offset(path, f"{case.id}/record/codes.npy") + 5
    data = bytearray(path.read_bytes())
    data[off] ^= 0x10
    path.write_bytes(bytes(data))
    rc, out = _run_cli("check", "--golden-dir", str(golden_copy))
    assert rc == 1
    line = next(ln for ln in out.splitlines() if f"{case.id} record.codes" in ln)
    assert "first difference at index" in line and "(1 bit(s))" in line and "xor 0x" in line
    assert f"{case.file}: sha256 does not match the manifest" in out


def test_flipped_hex_digit_in_toml_names_case(golden_copy):
    case = next(golden.iter_cases(golden_copy, methods=["kivi"], kinds=["encode"]))
    path = golden_copy / case.file
    text = path.read_text()
    start = text.index(f'id = "{case.id}"')
    at = text.index("[case.decoded]", start)
    at = text.index('"0x', at) + 3
    flipped = "1" if text[at] != "1" else "3"
    path.write_text(text[:at] + flipped + text[at + 1:])
    rc, out = _run_cli("check", "--golden-dir", str(golden_copy))
    assert rc == 1
    assert any(f"{case.id} decoded: first difference at index" in ln for ln in out.splitlines()), out


def test_flipped_component_vector_is_reported(golden_copy):
    path = golden_copy / "cases" / "prng.toml"
    text = path.read_text()
    at = text.index('output = "0x') + len('output = "0x')
    path.write_text(text[:at] + ("0" if text[at] != "0" else "1") + text[at + 1:])
    rc, out = _run_cli("check", "--golden-dir", str(golden_copy))
    assert rc == 1 and "prng-mix64-000 output: first difference at index" not in out
    assert "prng-mix64-000 output: golden" in out


def test_missing_file_is_reported(golden_copy):
    (golden_copy / "cases" / "packing.toml").unlink()
    rc, out = _run_cli("check", "--golden-dir", str(golden_copy))
    assert rc == 1 and "cases/packing.toml: missing" in out


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_reference_reproduces_every_case_through_iter_cases():
    """The conformance path: load each case with the public API and replay it on the reference."""
    n = 0
    for c in golden.iter_cases():
        n += 1
        if c.kind == "error":
            with pytest.raises(Exception) as ei:
                reference.encode(c.x, c.params, c.dtype)
            assert c.expected_error_matches(ei.value), (c.id, ei.value)
            continue
        if c.kind == "decode_error":
            with pytest.raises(ValueError, match=r"^record:"):
                reference.decode(c.record, c.params, c.dtype)
            continue
        if c.kind == "encode":
            rec = reference.encode(c.x, c.params, c.dtype)
        else:
            s = reference.stream.Stream(c.params, c.dtype)
            s, trimmed = golden.replay(s, c.x, c.ops, golden._reference_reload)
            assert trimmed == list(c.trimmed), c.id
            rec = s.record()
        assert list(rec) == list(c.record), c.id
        for k in rec:
            assert _bits_equal(rec[k], c.record[k]), (c.id, k)
        assert _bits_equal(reference.decode(c.record, c.params, c.dtype), c.decoded), c.id
    assert n == len(golden.load_manifest()["case"])


def test_chunked_streams_store_the_one_shot_record():
    """streaming.md: any chunking of the same tokens stores the bytes of one-shot encode."""
    seen = 0
    for c in golden.iter_cases(kinds=["stream"]):
        if "trim" in c.flags:
            continue
        pos, kept = 0, []          # the appended tokens: rejected chunks are not part of the stream
        for op, n in c.ops:
            if op in ("append", "reject") or op in golden.STREAM_OPS and op.startswith("reject_") and \
                    op != "reject_trim":
                if op == "append":
                    kept.append(c.x[:, :, pos:pos + n])
                pos += n
        one_shot = reference.encode(np.ascontiguousarray(np.concatenate(kept, axis=2)), c.params, c.dtype)
        for k in one_shot:
            assert _bits_equal(one_shot[k], c.record[k]), (c.id, k)
        seen += 1
    assert seen >= 2 * len(golden.available_methods())


def test_tie_cases_put_u_on_the_boundary():
    ties = [c for c in golden.iter_cases(flags=["tie"]) if c.method not in ("kivi", "mlx_affine")]
    assert len(ties) >= 10
    for c in ties:
        assert golden.verify_tie(c.x, c.dtype, c.params, c.id.rsplit("-tie-", 1)[1]) > 0, c.id
