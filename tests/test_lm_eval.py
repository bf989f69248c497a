"""`EvalTask.from_lm_eval`: lm-evaluation-harness's tasks collected, asked
and scored by lm-eval's own code (docs/lm_eval.md).

The side-by-side tests run the same local-file task twice against one
OpenAI-compatible stub (tests/http_stub.py): by `lm_eval --model
local-completions`, and by the plugin with `--evalreplay-provider=openai`;
the metric values must be identical. They need lm-eval (the `lm-eval`
extra) and skip without it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import orjson
import pytest
from http_stub import StubServer
from lm_eval_tasks import (
    MODULE,
    as_ours,
    lm_eval_env,
    needs_lm_eval,
    our_metrics,
    provider_args,
    run_plugin,
    their_metrics,
    write_arith,
    write_tiny_mc,
    write_tiny_ppl,
)
from subprocess_pytest import PYTEST, child_env


@needs_lm_eval
@pytest.mark.slow
def test_generate_until_with_few_shot_and_regex_filters_matches_lm_eval(
    tmp_path: Path, stub: StubServer
) -> None:
    write_arith(tmp_path / "tasks")
    done = run_plugin(tmp_path, stub)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ours = our_metrics(tmp_path, "arith")
    theirs = as_ours(their_metrics(tmp_path, "arith", stub))
    assert set(ours) == {"exact_match,strict", "exact_match,flexible"}
    assert ours == theirs
    assert 0 < ours["exact_match,strict"] < 1  # the regex found answers, and not all right
    # each predictions row holds the document as lm-eval's --log_samples holds it
    logged = [
        orjson.loads(line)
        for f in (tmp_path / "lm-eval-out").rglob("samples_arith_*.jsonl")
        for line in f.read_bytes().splitlines()
    ]
    rows = [
        orjson.loads(line)
        for line in (tmp_path / "run" / "arith-predictions.jsonl").read_bytes().splitlines()
    ]
    assert {r["instance_id"]: r["doc"] for r in rows} == {str(s["doc_id"]): s["doc"] for s in logged}
    # lm-eval's own --log_samples output replays into the same task: the same numbers, no model asked
    asked = stub.received
    samples = next((tmp_path / "lm-eval-out").iterdir())
    done = run_plugin(tmp_path, stub, f"--evalreplay-predictions={samples}", "--evalreplay-output=replayed")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    replayed = orjson.loads((tmp_path / "replayed" / "arith-metrics.json").read_bytes())["metrics"]
    assert replayed == theirs and stub.received == asked
    # a changed filter rescores lm-eval's saved answers (the samples file itself given, this time)
    yaml = tmp_path / "tasks" / "arith.yaml"
    yaml.write_text(yaml.read_text("utf-8").replace('"Answer: (-?[0-9]+)"', '"Answer: (-?[0-9]+)!"'), "utf-8")
    (samples_file,) = samples.glob("samples_arith_*.jsonl")
    done = run_plugin(
        tmp_path, stub, f"--evalreplay-predictions={samples_file}", "--evalreplay-output=refiltered"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    refiltered = orjson.loads((tmp_path / "refiltered" / "arith-metrics.json").read_bytes())["metrics"]
    assert refiltered == {**theirs, "exact_match,strict": 0.0} and stub.received == asked


@needs_lm_eval
@pytest.mark.slow
def test_multiple_choice_acc_and_acc_norm_match_lm_eval(tmp_path: Path, stub: StubServer) -> None:
    write_tiny_mc(tmp_path / "tasks")
    done = run_plugin(tmp_path, stub, name="tiny_mc")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ours = our_metrics(tmp_path, "tiny_mc")
    theirs = as_ours(their_metrics(tmp_path, "tiny_mc", stub))
    assert set(ours) == {"acc", "acc_norm"}
    assert ours == theirs
    assert ours["acc"] != ours["acc_norm"]
    samples = next((tmp_path / "lm-eval-out").iterdir())
    done = run_plugin(
        tmp_path, stub, f"--evalreplay-predictions={samples}", "--evalreplay-output=replayed", name="tiny_mc"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    replayed = orjson.loads((tmp_path / "replayed" / "tiny_mc-metrics.json").read_bytes())["metrics"]
    assert replayed == theirs


@needs_lm_eval
@pytest.mark.slow
def test_loglikelihood_rolling_perplexities_match_lm_eval(tmp_path: Path, stub: StubServer) -> None:
    # A context of 8 tokens: windows of at most 6 scored tokens, so every text of 7 words or more
    # is cut into several (lm-eval's max_length is the same 8). The prefix token: <s>, whose id the
    # stub hands out first (0), so both sides take </s> (lm-eval's `bos_token_id or eos_token_id`).
    stub.bos = True
    stub.eos = "</s>"
    stub.max_model_len = 8
    write_tiny_ppl(tmp_path / "tasks", words=(3, 30))
    done = run_plugin(tmp_path, stub, name="tiny_ppl")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = orjson.loads((tmp_path / "run" / "tiny_ppl-metrics.json").read_bytes())
    ours_sent = [b for b in stub.bodies() if b.get("echo")]
    theirs = as_ours(their_metrics(tmp_path, "tiny_ppl", stub, extra=",max_length=8"))
    assert set(doc["metrics"]) == {"word_perplexity", "byte_perplexity", "bits_per_byte"}
    assert doc["metrics"] == theirs
    assert doc["lm_eval"]["higher_is_better"] == {
        "word_perplexity": False,
        "byte_perplexity": False,
        "bits_per_byte": False,
    }
    # The same windows went out: ours in one echo per text, lm-eval's one per window.
    their_sent = [b for b in stub.bodies() if b.get("echo")][len(ours_sent) :]
    windows = sorted(tuple(w) for b in ours_sent for w in b["prompt"])
    assert windows == sorted(tuple(w) for b in their_sent for w in b["prompt"])
    assert len(windows) > len(ours_sent)  # some texts needed more than one window
    assert max(len(w) for w in windows) == 7


@needs_lm_eval
def test_items_are_one_per_document_named_by_doc_id(tmp_path: Path, stub: StubServer) -> None:
    write_arith(tmp_path / "tasks", n=5)
    done = run_plugin(tmp_path, stub, "--collect-only")
    assert done.returncode == 0, done.stdout + done.stderr
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    assert ids == [f"test_lm.py::arith::{i}[s1-r0]" for i in range(5)]
    # -k on doc ids ("1[" is document 1's item, not the "s1" of every item) runs those documents only
    done = run_plugin(tmp_path, stub, "-k", "1[ or 3[")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 passed, 3 deselected" in done.stdout, done.stdout[-3000:]
    assert stub.received == 2
    saved = (tmp_path / "run" / "arith-predictions.jsonl").read_bytes().splitlines()
    assert [orjson.loads(line)["instance_id"] for line in saved] == ["1", "3"]


BROKEN = {
    "unknown task": ("nope", "", "lm-eval task 'nope': lm-eval knows no task, group or tag of that name"),
    "dataset not loadable": (
        "arith",
        "missing-data",
        "lm-eval task 'arith': its dataset could not be loaded (",
    ),
    "repeats": ("arith", "repeats: 3", "lm-eval task 'arith': repeats: 3; lm-eval's filters see all repeats"),
    "median aggregation": (
        "arith",
        "aggregation: median",
        "lm-eval task 'arith': metric 'exact_match' aggregates with 'median'",
    ),
}


@needs_lm_eval
@pytest.mark.parametrize("case", list(BROKEN))
def test_a_task_lm_eval_cannot_give_us_is_a_collection_error_naming_it(
    tmp_path: Path, stub: StubServer, case: str
) -> None:
    name, edit, message = BROKEN[case]
    yaml = write_arith(tmp_path / "tasks", n=3)
    text = yaml.read_text(encoding="utf-8")
    if edit == "missing-data":
        text = text.replace("arith_test.jsonl", "gone.jsonl")
    elif edit.startswith("aggregation"):
        text = text.replace("aggregation: mean", edit)
    elif edit:
        text += edit + "\n"
    yaml.write_text(text, encoding="utf-8")
    done = run_plugin(tmp_path, stub, "--collect-only", name=name)
    out = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.INTERRUPTED, out
    assert message in out, out
    assert "Traceback" not in out and "lm_eval/" not in out and "pytest_evalreplay/" not in out, out
    assert stub.received == 0


def test_without_lm_eval_the_task_is_a_collection_error_naming_the_extra(
    tmp_path: Path, stub: StubServer
) -> None:
    fake = tmp_path / "no-lm-eval" / "lm_eval"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'lm_eval'\")\n", encoding="utf-8")
    path = os.pathsep.join(filter(None, [str(fake.parent), os.environ.get("PYTHONPATH")]))
    done = run_plugin(tmp_path, stub, "--collect-only", env={"PYTHONPATH": path})
    out = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "lm-eval task 'arith': EvalTask.from_lm_eval needs lm-evaluation-harness" in out, out
    assert "pip install 'pytest-evalreplay[lm-eval]'" in out, out
    assert "Traceback" not in out, out


@needs_lm_eval
def test_replay_of_our_run_dir_and_a_gate_on_lm_eval_metric_names(tmp_path: Path, stub: StubServer) -> None:
    write_arith(tmp_path / "tasks", n=12)
    module = "from pytest_evalreplay import Gate\n" + MODULE
    done = run_plugin_with(
        tmp_path, stub, module.format(name="arith", extra=', gate=Gate("exact_match,strict", min=0.2)')
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "PASSED test_lm.py::arith::gate" in done.stdout
    first = our_metrics(tmp_path, "arith")
    asked = stub.received
    replay = run_plugin_with(
        tmp_path,
        stub,
        module.format(name="arith", extra=', gate=Gate("exact_match,strict", min=0.9)'),
        "--evalreplay-predictions=run",
        "--evalreplay-output=replayed",
    )
    assert replay.returncode == pytest.ExitCode.TESTS_FAILED, replay.stdout[-3000:]
    assert "exact_match,strict 0.2500 is below min 0.9" in replay.stdout
    assert orjson.loads((tmp_path / "replayed" / "arith-metrics.json").read_bytes())["metrics"] == first
    assert stub.received == asked


def run_plugin_with(
    project: Path, stub: StubServer, module: str, *args: str
) -> subprocess.CompletedProcess[str]:
    (project / "test_lm.py").write_text(module, encoding="utf-8")
    cmd = [
        *PYTEST,
        "-rA",
        "test_lm.py",
        *provider_args(stub, args),
        *args,
    ]
    env = child_env(**lm_eval_env(project / "hf"))
    return subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=600)


@needs_lm_eval
@pytest.mark.slow
def test_a_kill_mid_run_then_resume_asks_only_what_was_in_flight(tmp_path: Path) -> None:
    n = 60
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    for project in (clean, killed):
        write_arith(project / "tasks", n=n)
    with StubServer("stub-model") as stub:
        done = run_plugin(clean, stub)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with StubServer("stub-model", delay=0.05) as stub:
        (killed / "test_lm.py").write_text(MODULE.format(name="arith", extra=""), encoding="utf-8")
        cmd = [
            *PYTEST,
            "-q",
            "test_lm.py",
            "--evalreplay-provider=openai",
            "--evalreplay-model=stub-model",
            f"--evalreplay-base-url={stub.url}",
            "--evalreplay-output=run",
            "--evalreplay-concurrency=2",
        ]
        env = child_env(**lm_eval_env(killed / "hf"))
        proc = subprocess.Popen(
            cmd, cwd=killed, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 120
        while stub.answered < n // 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        before = stub.answered
        saved = journaled_gens(killed)
        assert 0 < len(saved) < n
        resumed = subprocess.run(
            [*cmd, "--resume"], cwd=killed, env=env, capture_output=True, text=True, timeout=600
        )
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        # asked again: only what the journal lacked (what was in flight at the kill, and the rest)
        assert stub.answered - before == n - len(saved)
        assert before - len(saved) <= 2 + 1  # in flight (concurrency 2) and the last answer's write
    assert our_metrics(killed, "arith") == our_metrics(clean, "arith")


def journaled_gens(project: Path) -> set[str]:
    path = project / "run" / "arith-journal.jsonl"
    lines = path.read_bytes().splitlines() if path.exists() else []
    rows = []
    for line in lines:
        try:
            rows.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue  # a torn last line
    return {r["instance_id"] for r in rows if r.get("type") == "gen"}


@needs_lm_eval
def test_compiled_templates_render_what_lm_eval_renders_and_put_its_function_back() -> None:
    import jinja2
    from lm_eval import utils

    from pytest_evalreplay.lmeval.loading import compiled_templates

    original = utils.apply_template
    doc = {"question": "1+2", "choices": ["red", "blue"], "gold": 1}
    template = (
        "Question: {{question}}\n{{choices | join(', ')}} {{ choices[gold] | regex_replace('e', 'E') }}\n"
    )
    expected = original(template, doc)
    with compiled_templates():
        assert utils.apply_template is not original
        assert utils.apply_template(template, doc) == expected
        assert utils.apply_template(template, {**doc, "question": "2+2"}) == original(
            template, {**doc, "question": "2+2"}
        )
        with compiled_templates():  # nested: still the one cache, and put back only by the outer
            assert utils.apply_template(template, doc) == expected
        assert utils.apply_template is not original
        with pytest.raises(jinja2.UndefinedError):  # lm-eval's StrictUndefined still refuses a missing field
            utils.apply_template("{{nope}}", doc)
    assert utils.apply_template is original
