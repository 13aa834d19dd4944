"""Code bundles: .nniignore, NNI's limits, refused symlinks, deterministic archives, safe extraction."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from trialflow.records.codebundle import CodeDirError, scan_code_dir
from trialflow.trial.unpack import UnsafeArchiveError, extract_stream


def _files(root: Path, names: list[str]) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"content of {name}\n")


def _names(bundle) -> set[str]:
    return {e.rel for e in bundle.entries if e.kind != "dir"}


def test_nniignore_nested_and_negation(tmp_path):
    _files(tmp_path, ["main.py", "train.log", "keep.log", "data/big.bin", "data/README.md",
                      "sub/model.py", "sub/ckpt.pt", "sub/deep/best.pt", "sub/deep/last.pt", "notes/a.log"])
    (tmp_path / ".nniignore").write_text("*.log\n!keep.log\ndata/\n")
    (tmp_path / "sub" / ".nniignore").write_text("*.pt\n")
    (tmp_path / "sub" / "deep").mkdir(exist_ok=True)
    (tmp_path / "sub" / "deep" / ".nniignore").write_text("!best.pt\n")
    names = _names(scan_code_dir(tmp_path))
    assert names == {".nniignore", "main.py", "keep.log", "sub/.nniignore", "sub/model.py",
                     "sub/deep/.nniignore", "sub/deep/best.pt"}


def test_2001_files_are_refused_with_where_they_are_and_the_fix(tmp_path):
    _files(tmp_path, ["train.py"] + [f"cache/f{i}.txt" for i in range(2000)])
    with pytest.raises(CodeDirError) as err:
        scan_code_dir(tmp_path)
    message = str(err.value)
    assert "has 2001 files; the limit is 2000" in message
    assert "cache/ (2000 files)" in message and ".nniignore" in message and "\n  cache/" in message
    (tmp_path / ".nniignore").write_text("cache/\n")
    assert _names(scan_code_dir(tmp_path)) == {".nniignore", "train.py"}


def test_301_mb_is_refused_naming_the_largest_files(tmp_path):
    _files(tmp_path, ["train.py"])
    with open(tmp_path / "weights.bin", "wb") as f:  # sparse: no real disk use
        f.truncate(301 * 1024 * 1024)
    with pytest.raises(CodeDirError) as err:
        scan_code_dir(tmp_path)
    assert "is 301.0 MB; the limit is 300.0 MB" in str(err.value)
    assert "weights.bin (301.0 MB)" in str(err.value) and "\n  weights.bin" in str(err.value)


def test_symlink_outside_is_refused_inside_is_kept(tmp_path):
    code = tmp_path / "code"
    _files(code, ["train.py", "conf/base.yml"])
    os.symlink("conf/base.yml", code / "config.yml")
    bundle = scan_code_dir(code)
    assert {e.rel: e.link for e in bundle.entries if e.kind == "link"} == {"config.yml": "conf/base.yml"}
    (tmp_path / "secret.txt").write_text("x")
    os.symlink(tmp_path / "secret.txt", code / "leak.txt")
    with pytest.raises(CodeDirError, match=r"leak.txt -> .*secret.txt .* points outside it.*\.nniignore"):
        scan_code_dir(code)


def test_archive_is_deterministic_and_keyed_by_content(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        _files(root, ["train.py", "lib/util.py"])
        (root / "run.sh").write_text("#!/bin/sh\n")
        (root / "run.sh").chmod(0o755)
    os.utime(b / "train.py", (1, 1))  # mtimes differ, contents do not
    assert scan_code_dir(a).content_hash() == scan_code_dir(b).content_hash()
    (b / "lib" / "util.py").write_text("changed\n")
    assert scan_code_dir(a).content_hash() != scan_code_dir(b).content_hash()


def test_content_hash_cache_skips_rehashing_an_unchanged_directory(tmp_path):
    _files(tmp_path / "code", ["train.py"])
    cache = tmp_path / "cache.json"
    first = scan_code_dir(tmp_path / "code").content_hash(cache)
    bundle = scan_code_dir(tmp_path / "code")
    bundle.stream = None  # would raise if the archive were generated again
    assert bundle.content_hash(cache) == first


def test_round_trip_extraction_preserves_files_modes_and_links(tmp_path):
    code = tmp_path / "code"
    _files(code, ["train.py", "pkg/mod.py"])
    (code / "empty").mkdir()
    (code / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (code / "run.sh").chmod(0o755)
    os.symlink("pkg/mod.py", code / "alias.py")
    bundle = scan_code_dir(code)
    buf = io.BytesIO()
    digest = bundle.stream(buf.write)
    buf.seek(0)
    assert extract_stream(buf, str(tmp_path / "out"), digest) == 3  # regular files
    out = tmp_path / "out"
    assert (out / "pkg" / "mod.py").read_text() == "content of pkg/mod.py\n"
    assert os.access(out / "run.sh", os.X_OK) and not os.access(out / "train.py", os.X_OK)
    assert os.readlink(out / "alias.py") == "pkg/mod.py" and (out / "empty").is_dir()


def _tar(members: list[tarfile.TarInfo]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for m in members:
            tar.addfile(m, io.BytesIO(b"x" * m.size) if m.isfile() else None)
    buf.seek(0)
    return buf


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = 1 if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize("members, message", [
    ([_member("ok.txt"), _member("../evil.txt")], "contains '..'"),
    ([_member("a/../../evil.txt")], "contains '..'"),
    ([_member("/etc/evil.txt")], "absolute path"),
    ([_member("link", tarfile.SYMTYPE, "/etc")], "outside the bundle"),
    ([_member("link", tarfile.SYMTYPE, "../../etc")], "outside the bundle"),
    ([_member("d", tarfile.SYMTYPE, "."), _member("d/x.txt")], "inside a symbolic link"),
    ([_member("hard", tarfile.LNKTYPE, "ok.txt")], "hard link"),
    ([_member("dev", tarfile.CHRTYPE)], "device"),
])
def test_unsafe_archives_are_refused_and_nothing_is_left(tmp_path, members, message):
    target = tmp_path / "target"
    with pytest.raises(UnsafeArchiveError, match=message):
        extract_stream(_tar(members), str(target))
    assert not target.exists() and list(tmp_path.iterdir()) == []
    assert not (tmp_path.parent / "evil.txt").exists()


def test_checksum_mismatch_is_refused(tmp_path):
    with pytest.raises(UnsafeArchiveError, match="checksum mismatch"):
        extract_stream(_tar([_member("a.txt")]), str(tmp_path / "t"), "0" * 64)
    assert not (tmp_path / "t").exists()


def test_unpack_command_reports_a_traversal_archive(tmp_path):
    proc = subprocess.run([sys.executable, "-S", "-m", "trialflow.trial.unpack", str(tmp_path / "t")],
                          input=_tar([_member("../evil.txt")]).read(), capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert proc.returncode == 3 and b"refused" in proc.stderr and b"'..'" in proc.stderr


def test_withheld_files_are_found_by_path_and_by_content_across_read_chunks(tmp_path, monkeypatch):
    from pydantic import SecretStr

    from trialflow.config import RemoteMachineConfig
    from trialflow.foundation import withheld

    for name in ("_files", "_secrets", "_announced"):  # this process's registry, for this test only
        monkeypatch.setattr(withheld, name, set())
    monkeypatch.setattr(withheld, "READ_CHUNK", 7)  # the secret spans two reads
    code = tmp_path / "code"
    code.mkdir()
    (code / "run.yml").write_text("anything")
    (code / "split.bin").write_bytes(b"xxxxxs3cr3t-valuexxxx")
    (code / "short.txt").write_text("pw")  # a value that short is everywhere: not looked for
    (code / "clean.py").write_text("print(1)")
    machine = RemoteMachineConfig(host="h", user="u", password=SecretStr("s3cr3t-value"), ssh_passphrase="pw")
    withheld.withhold(machine, code / "run.yml")
    assert [e.rel for e in scan_code_dir(code).entries] == ["clean.py", "short.txt"]
