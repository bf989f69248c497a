"""One JSONL line is at most `storage.lines.MAX_LINE_BYTES` (256 MiB) in every
reader: a longer one is refused naming file:line and the cap before it is
parsed (issue 30, case 4: one 1 GB line took gigabytes). The cap is made
small here, so nothing large is written."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from pytest_evalreplay.formats import load
from pytest_evalreplay.formats.instances import load_instances
from pytest_evalreplay.formats.jsonl import first_row, parse_lines
from pytest_evalreplay.formats.lm_eval import read_samples
from pytest_evalreplay.journal.compaction import compact_journal
from pytest_evalreplay.journal.index import JournalIndex
from pytest_evalreplay.journal.rows import header_row
from pytest_evalreplay.journal.transcripts import SavedEpisodes, numbered_rows
from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.rundir.merge import merge_journal
from pytest_evalreplay.storage import lines as line_reader

CAP = 300
SHORT = orjson.dumps({"id": "a", "instance_id": "a"})
LONG = orjson.dumps({"id": "b", "instance_id": "b", "pad": "x" * CAP})
HEADER = orjson.dumps(header_row("t", "r1"))


@pytest.fixture(autouse=True)
def small_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(line_reader, "MAX_LINE_BYTES", CAP, raising=False)


def lines(*rows: bytes) -> bytes:
    return b"".join(r + b"\n" for r in rows)


def refused(where: str, read: Callable[[], object]) -> None:
    with pytest.raises(EvalReplayError) as err:
        read()
    message = str(err.value)
    assert message.startswith(f"{where}: a line over {CAP:,} bytes"), message
    assert "Fix or delete that line" in message


def test_an_instances_file(tmp_path: Path) -> None:
    path = tmp_path / "i.jsonl"
    path.write_bytes(lines(SHORT, SHORT, LONG))
    refused(f"{path}:3", lambda: load_instances(path, tmp_path))


def test_a_saved_run_s_lines_and_its_sniffed_first_row(tmp_path: Path) -> None:
    path = tmp_path / "o.jsonl"
    path.write_bytes(lines(LONG, SHORT))
    refused(f"{path}:1", lambda: list(parse_lines(path)))
    assert first_row(path) is None
    path.write_bytes(lines(SHORT, LONG))
    assert first_row(path) == orjson.loads(SHORT)


def test_an_lm_eval_samples_file_once_unpacked(tmp_path: Path) -> None:
    path = tmp_path / "samples_t_2024.jsonl.gz"
    path.write_bytes(gzip.compress(lines(SHORT, LONG)))
    refused(f"{path}:2", lambda: read_samples(path))


def test_our_run_dir_s_predictions_and_requests(tmp_path: Path) -> None:
    request = orjson.dumps(
        {
            "instance_id": "a",
            "request_type": "generate",
            "context": "q",
            "system_prompt": None,
            "num_samples": 1,
            "sampling": {},
        }
    )
    long_request = request.replace(b'"q"', b'"' + b"q" * CAP + b'"')
    pred = orjson.dumps({"instance_id": "a", "model": "m", "generations": [{"text": "x"}], "scores": {}})
    (tmp_path / "t-requests.jsonl").write_bytes(lines(request))
    (tmp_path / "t-predictions.jsonl").write_bytes(lines(pred.replace(b'"x"', b'"' + b"x" * CAP + b'"')))
    refused(f"{tmp_path / 't-predictions.jsonl'}:1", lambda: load(tmp_path / "t-predictions.jsonl"))
    (tmp_path / "t-predictions.jsonl").write_bytes(lines(pred))
    load(tmp_path / "t-predictions.jsonl")
    (tmp_path / "t-requests.jsonl").write_bytes(lines(long_request))
    refused(f"{tmp_path / 't-requests.jsonl'}:1", lambda: load(tmp_path / "t-predictions.jsonl"))


def test_a_task_journal_read_and_caught_up(tmp_path: Path) -> None:
    path = tmp_path / "t-journal.jsonl"
    path.write_bytes(lines(HEADER))
    index = JournalIndex(path, "t")
    index.refresh()
    with path.open("ab") as fh:
        fh.write(lines(SHORT, LONG))
    refused(f"{path}:3", index.refresh)
    refused(f"{path}:3", lambda: JournalIndex(path, "t").refresh())
    refused(f"{path}:3", lambda: compact_journal(path, "t", "r2"))


def test_transcripts_read_for_replay_and_for_the_report(tmp_path: Path) -> None:
    path = tmp_path / "t-transcripts.jsonl"
    path.write_bytes(lines(SHORT, LONG))
    refused(f"{path}:2", lambda: numbered_rows(path))
    refused(f"{path}:2", lambda: SavedEpisodes.read(tmp_path, "t"))


def test_a_shard_s_journal_when_merged() -> None:
    refused(
        "shards/1/t-journal.jsonl:2",
        lambda: merge_journal("t-journal.jsonl", [("shards/1", lambda: lines(HEADER, LONG))], []),
    )


def test_a_gzipped_lm_eval_samples_file_that_unpacks_like_a_bomb(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same case's other half for lm-eval: a `.jsonl.gz` unpacked whole
    however large; now a chunk at a time, refused past 200 to 1."""
    from pytest_evalreplay.formats import lm_eval

    monkeypatch.setattr(lm_eval, "MAX_RATIO_FLOOR", 1 << 16, raising=False)
    monkeypatch.setattr(line_reader, "MAX_LINE_BYTES", 1 << 30)
    path = tmp_path / "samples_t_2024.jsonl.gz"
    path.write_bytes(gzip.compress(b"\n" * (4 << 20)))
    with pytest.raises(EvalReplayError, match=r"unpacks to over .* \(more than the 200 to 1 of real JSONL\)"):
        read_samples(path)
    real = lines(*(SHORT for _ in range(1000)))
    path.write_bytes(gzip.compress(real[:500]) + gzip.compress(real[500:]))  # two members, as gzip writes
    assert read_samples(path) == real.splitlines()
