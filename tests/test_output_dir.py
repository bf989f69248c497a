"""The output dir the plugin keeps (issue #18 cases 11 and 12): a custom
`--evalreplay-output` it creates is tagged as a cache dir like pytest's own
(`CACHEDIR.TAG`, `.gitignore`); a symlink planted at one of the plugin's own
names inside it (a lock file, the locks or progress folder) is refused with a
message naming it, and whatever it points to is left as it was."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from echo_project import CONFTEST
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_evalreplay import EvalReplayError
from pytest_evalreplay.rundir.writer import CACHEDIR_TAG, prepare_output_dir
from pytest_evalreplay.storage.files import NoFollowLock, own_dir, temporary_prefix, temporary_target

pytestmark = pytest.mark.filterwarnings("error")


EVALS = """
from pytest_evalreplay import EvalTask
t = EvalTask("t", [{"id": "a"}, {"id": "b"}], prompt="Q {id}", scorer=lambda text, i: 1.0)
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nevalreplay_provider = echo\n")
    pytester.makepyfile(test_evals=EVALS)
    return pytester


# -- case 11: a custom output dir is tagged as a cache dir ------------------------------


def test_a_custom_output_dir_the_plugin_creates_gets_cachedir_tag_and_gitignore(
    project: pytest.Pytester,
) -> None:
    project.runpytest("--evalreplay-output=runs/out").assert_outcomes(passed=2)
    out = project.path / "runs" / "out"
    assert (out / "CACHEDIR.TAG").read_bytes().startswith(b"Signature: 8a477f597d28d172789f06886806bc55\n")
    assert (out / ".gitignore").read_text().splitlines()[-1] == "*"
    assert not (project.path / "runs" / "CACHEDIR.TAG").exists()  # only the output dir itself
    assert (out / "t-predictions.jsonl").is_file()


def test_a_directory_the_user_made_is_not_tagged(project: pytest.Pytester) -> None:
    """Like pytest, the tags are written only into a directory the plugin creates:
    a folder the user made (maybe tracked by git) is left as it is."""
    out = project.path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    project.runpytest("--evalreplay-output=mine").assert_outcomes(passed=2)
    assert not (out / "CACHEDIR.TAG").exists() and not (out / ".gitignore").exists()


def test_a_tagged_run_dir_replays_and_compares(project: pytest.Pytester) -> None:
    project.runpytest("--evalreplay-output=out").assert_outcomes(passed=2)
    result = project.runpytest(
        "--evalreplay-provider=replay", "--evalreplay-predictions=out", "--evalreplay-output=again"
    )
    result.assert_outcomes(deselected=2)


def test_prepare_output_dir_tags_only_what_it_creates(tmp_path: Path) -> None:
    prepare_output_dir(tmp_path / "new")
    assert (tmp_path / "new" / "CACHEDIR.TAG").read_bytes() == CACHEDIR_TAG
    (tmp_path / "new" / ".gitignore").unlink()
    prepare_output_dir(tmp_path / "new")  # exists now: a removed .gitignore stays removed
    assert not (tmp_path / "new" / ".gitignore").exists()


# -- case 12: links planted in the output dir ----------------------------------------------

FILE_LINKS = [".t.lock", ".evalreplay-session.lock", ".manifest.lock", ".evalreplay-session-workers.lock"]
DIR_LINKS = [".evalreplay-locks", ".evalreplay-progress"]


def precious_file(root: Path) -> Path:
    target = root / "precious.txt"
    target.write_text("do not touch\n")
    return target


def precious_dir(root: Path) -> Path:
    target = root / "precious"
    target.mkdir()
    (target / "keep.json").write_text('{"keep": true}\n')
    (target / "t.1.lock").write_text("not a lock\n")
    return target


def listing(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("name", FILE_LINKS)
def test_a_file_link_at_a_lock_name_is_refused_and_its_target_untouched(
    project: pytest.Pytester, name: str
) -> None:
    target = precious_file(project.path)
    out = project.path / "out"
    out.mkdir()
    (out / name).symlink_to(target)
    result = project.runpytest("--evalreplay-output=out")
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert f"{out / name} is a symbolic link" in text and f"rm {out / name}" in text, text
    assert "Traceback" not in text and "INTERNALERROR" not in text, text
    assert target.read_text() == "do not touch\n"
    assert (out / name).is_symlink()


@pytest.mark.parametrize("name", DIR_LINKS)
def test_a_dir_link_at_an_own_folder_is_refused_and_its_target_untouched(
    project: pytest.Pytester, name: str
) -> None:
    target = precious_dir(project.path)
    before = listing(target)
    out = project.path / "out"
    out.mkdir()
    (out / name).symlink_to(target, target_is_directory=True)
    result = project.runpytest("--evalreplay-output=out")
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert f"{out / name} is a symbolic link" in text, text
    assert listing(target) == before


@pytest.mark.slow  # pytest-xdist workers started
def test_under_xdist_a_progress_dir_link_deletes_nothing(project: pytest.Pytester) -> None:
    """The controller's stale-progress cleanup used to glob the link's target
    and unlink every *.json there."""
    pytest.importorskip("xdist")
    target = precious_dir(project.path)
    (target / "gw0.json").write_text("{}")
    before = listing(target)
    out = project.path / "out"
    out.mkdir()
    (out / ".evalreplay-progress").symlink_to(target, target_is_directory=True)
    result = project.runpytest("--evalreplay-output=out", "-n", "2", "-p", "no:benchmark")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert listing(target) == before


@pytest.mark.slow  # pytest-xdist workers started
def test_under_xdist_stale_progress_files_of_this_run_s_workers_go_and_nothing_else(
    project: pytest.Pytester,
) -> None:
    pytest.importorskip("xdist")
    progress = project.path / "out" / ".evalreplay-progress"
    progress.mkdir(parents=True)
    (progress / "gw0.json").write_text('{"task": "old"}')
    (progress / "notes.json").write_text("{}")  # not a name the plugin writes
    result = project.runpytest("--evalreplay-output=out", "-n", "2", "-p", "no:benchmark")
    result.assert_outcomes(passed=2)
    assert (progress / "notes.json").read_text() == "{}"
    assert not (progress / "gw0.json").exists() or (progress / "gw0.json").read_text() != '{"task": "old"}'


@pytest.mark.slow  # pytest-xdist workers started
def test_under_xdist_a_killed_worker_s_temporaries_go_at_the_next_run(project: pytest.Pytester) -> None:
    """A worker SIGKILLed while writing its progress file or its collection
    line (each an atomic write) leaves the write's temporary; the next run's
    controller, which holds the output dir before any worker starts, removes
    them, and nothing that is not one of its workers' files."""
    pytest.importorskip("xdist")
    out = project.path / "out"
    progress = out / ".evalreplay-progress"
    progress.mkdir(parents=True)
    stale = [progress / ".gw0.json.ab12cd_4.tmp", out / "..evalreplay-collection-gw1.json.k2j4h6g8.tmp"]
    kept = [progress / ".notes.json.ab12cd34.tmp", out / ".notes.txt.ab12cd34.tmp"]
    for path in (*stale, *kept):
        path.write_text('{"task": "o')
    result = project.runpytest("--evalreplay-output=out", "-n", "2", "-p", "no:benchmark")
    result.assert_outcomes(passed=2)
    assert [p.name for p in stale if p.exists()] == []
    assert all(p.exists() for p in kept)


def test_own_dir_refuses_a_link_and_a_file(tmp_path: Path) -> None:
    target = precious_dir(tmp_path)
    (tmp_path / "linked").symlink_to(target, target_is_directory=True)
    with pytest.raises(EvalReplayError, match="linked is a symbolic link"):
        own_dir(tmp_path / "linked")
    (tmp_path / "plain").write_text("x")
    with pytest.raises(EvalReplayError, match="plain: expected a folder of the plugin's here"):
        own_dir(tmp_path / "plain")
    assert own_dir(tmp_path / "fresh").is_dir()
    assert own_dir(tmp_path / "fresh").is_dir()  # an existing one is fine


@pytest.mark.parametrize("dangling", [False, True])
def test_a_lock_never_opens_through_a_link(tmp_path: Path, dangling: bool) -> None:
    target = tmp_path / ("nowhere" if dangling else "precious.txt")
    if not dangling:
        target.write_text("do not touch\n")
    (tmp_path / ".t.lock").symlink_to(target)
    lock = NoFollowLock(tmp_path / ".t.lock")
    with pytest.raises(EvalReplayError, match=r"\.t\.lock is a symbolic link"), lock:
        pass
    assert target.read_text() == "do not touch\n" if not dangling else not target.exists()


def test_a_lock_is_reentrant_and_released(tmp_path: Path) -> None:
    lock = NoFollowLock(tmp_path / ".t.lock")
    with lock:
        with lock:
            assert lock.is_locked
        assert lock.is_locked
    assert not lock.is_locked
    other = NoFollowLock(tmp_path / ".t.lock", timeout=0)
    with other:  # free again for another holder
        assert os.path.isfile(tmp_path / ".t.lock")


def test_taking_the_output_dir_removes_its_own_files_temporaries_and_no_others(tmp_path: Path) -> None:
    """What writers killed mid-write left (a journal's header, a run dir
    file, the manifest, the shard marker, a worker's collection line, the
    holder) goes when a session takes the dir, when none of them can run; a
    user's file's temporary, a temporary's look-alike and a link stay."""
    from pytest_evalreplay.rundir.writer import SessionLock

    own = [
        ".math-journal.jsonl.ab12cd34.tmp",
        ".math-judge-requests.jsonl.ef56gh78.tmp",
        ".math-metrics.json.k2j4h6g8.tmp",
        ".manifest.json.zz99zz99.tmp",
        ".evalreplay-shard.json.a_b_c_d_.tmp",
        "..evalreplay-collection-gw1.json.q1w2e3r4.tmp",
        "..evalreplay-session.json.oc56d_bc.tmp",
    ]
    kept = [".notes.txt.ab12cd34.tmp", ".math-journal.jsonl.tmp", "math-journal.jsonl.ab12cd34.tmp"]
    for name in (*own, *kept):
        (tmp_path / name).write_bytes(b'{"type": "hea')
    precious = precious_dir(tmp_path) / "saved.jsonl"
    precious.write_text("mine\n")
    (tmp_path / ".t-predictions.jsonl.l1nk0000.tmp").symlink_to(precious)
    lock = SessionLock(tmp_path, "r1")
    lock.acquire()
    lock.release()
    assert [n for n in own if (tmp_path / n).exists()] == []
    assert all((tmp_path / n).exists() for n in kept)
    assert (tmp_path / ".t-predictions.jsonl.l1nk0000.tmp").is_symlink() and precious.read_text() == "mine\n"


def test_a_journal_rewrite_killed_midway_leaves_no_temporary_after_the_resume(
    project: pytest.Pytester,
) -> None:
    """A session SIGKILLed while writing a journal whole (a new journal's
    header, a compaction, a reset: each an atomic write) leaves that write's
    temporary file; the resume removes it when it takes the output dir, also
    when it has nothing to add to the journal. Seen in CI's chaos run
    (seed1230, killed at a task's first write)."""
    project.runpytest("--evalreplay-output=run").assert_outcomes(passed=2)
    stale = project.path / "run" / ".t-journal.jsonl.8knh71do.tmp"  # as the kill left it
    stale.write_bytes(b'{"type": "header", "ta')
    project.runpytest("--evalreplay-output=run", "--resume").stdout.fnmatch_lines(["*0 to run, 2 reused*"])
    assert not stale.exists()


@given(st.text(alphabet="abcXYZ019._-", min_size=1, max_size=40).filter(lambda n: n not in (".", "..")))
@settings(max_examples=60, deadline=None)
def test_a_temporary_names_the_file_it_was_written_for(name: str) -> None:
    """`temporary_target` inverts what `atomic_write` names its temporary
    (dots in the name, a leading dot, mkstemp's random part) and nothing else."""
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / name
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=temporary_prefix(target), suffix=".tmp")
        os.close(fd)
        assert temporary_target(Path(tmp).name) == name
    assert temporary_target(name) is None or (name.startswith(".") and name.endswith(".tmp"))


def test_a_session_killed_while_writing_who_holds_the_dir_leaves_no_temporary(
    project: pytest.Pytester,
) -> None:
    out = project.path / "run"
    out.mkdir()
    stale = out / "..evalreplay-session.json.oc56d_bc.tmp"  # as a kill mid-write leaves it
    stale.write_bytes(b'{"run": "r0", "pi')
    project.runpytest("--evalreplay-output=run").assert_outcomes(passed=2)
    assert not stale.exists()
