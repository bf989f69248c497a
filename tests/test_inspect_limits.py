"""Issue #30 case 4: an inspect_ai `.eval` log is a zip, and a small one can
declare a member that unpacks to gigabytes (a 3 MB log with one deflated
3 GiB member took 6.3 GB of memory for 30 s). Members are capped by their
unpacked size and their compression ratio before any byte is unpacked."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest

from pytest_evalreplay.formats import inspect_ai
from pytest_evalreplay.model import EvalReplayError

LOG = Path(__file__).parent / "data" / "inspect_eval" / "deflate" / "tiny_qa-deflate.eval"


def with_member(tmp_path: Path, name: str, data: bytes) -> Path:
    out = tmp_path / "log.eval"
    shutil.copy(LOG, out)
    with zipfile.ZipFile(out, "a", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(name, data)
    return out


def test_a_member_over_the_size_cap_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.setattr(inspect_ai, "MAX_MEMBER_BYTES", 1 << 20)
    log = with_member(tmp_path, "samples/zz_epoch_1.json", b" " * (2 << 20))
    with pytest.raises(EvalReplayError) as info:
        inspect_ai.instances(log)
    message = str(info.value)
    assert f"{log}:samples/zz_epoch_1.json" in message and "2,097,152 bytes" in message
    assert "more than the 1,048,576" in message


def test_a_member_of_a_bomb_like_ratio_is_refused_naming_it(tmp_path):
    log = with_member(tmp_path, "samples/zz_epoch_1.json", b"0" * (64 << 20))
    with pytest.raises(EvalReplayError, match=r"samples/zz_epoch_1.json: unpacks to 67,108,864 bytes from "):
        inspect_ai.instances(log)


def test_the_shipped_logs_are_under_the_caps():
    assert inspect_ai.instances(LOG)
