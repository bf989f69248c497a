"""An lm-eval task loaded and its requests built, by lm-eval's own code.

`load` is the one place that imports lm-eval: lm-eval's `TaskManager` finds
the task (a registered name, a name under `include_path`, or a YAML path),
its dataset is loaded, its few-shot seed and `num_fewshot` are set as
`lm_eval` sets them, and `Task.build_all_requests` builds every document's
context and requests. What comes back is plain data per document plus the
task object that scores them (`scoring.py`). Every failure is an
`EvalReplayError` that names the task and says what to do, raised when the
task is collected: never a traceback from lm-eval's internals.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.model import Context, EvalReplayError

EXTRA = "pip install 'pytest-evalreplay[lm-eval]'"
SERVED = ("generate_until", "multiple_choice", "loglikelihood", "loglikelihood_rolling")
# lm-eval's aggregations the plugin reproduces (scoring.aggregate): the mean, and the perplexities
# over per-document (loglikelihood, words or bytes) pairs.
AGGREGATIONS = ("mean", "perplexity", "weighted_perplexity", "bits_per_byte")
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's API models' default max_gen_toks


@dataclass(frozen=True)
class DocRequests:
    """One document: its lm-eval id, the document, and what is asked about it.
    `continuations` for the loglikelihood kinds (one per choice), in lm-eval's
    request order; `gen_kwargs` for `generate_until`; `rolling` for
    `loglikelihood_rolling` (`context` is then the text)."""

    doc_id: int
    doc: Mapping[str, Any]
    context: Context
    continuations: tuple[str, ...] = ()
    gen_kwargs: Mapping[str, Any] = field(default_factory=dict)
    task: str = ""  # its lm-eval task's name
    rolling: bool = False

    def instance_id(self, grouped: bool) -> str:
        """`doc_id`; in a group or tag, `subtask/doc_id` (doc ids repeat across subtasks)."""
        return f"{self.task}/{self.doc_id}" if grouped else str(self.doc_id)


@dataclass(frozen=True)
class Chat:
    """How the prompt is laid out, as `lm_eval`'s `--apply_chat_template`,
    `--fewshot_as_multiturn` and `--system_instruction` lay it out: chat
    messages (few-shot examples as turns, unless `fewshot_as_multiturn` is
    False) or one text, with the system instruction first."""

    apply_chat_template: bool = False
    fewshot_as_multiturn: bool | None = None  # None: on with the chat template, as lm_eval's CLI
    system_instruction: str | None = None

    @property
    def multiturn(self) -> bool:
        if self.fewshot_as_multiturn is None:
            return self.apply_chat_template
        return self.fewshot_as_multiturn


@dataclass(frozen=True)
class Loaded:
    """A task, group or tag lm-eval built: its name, output type, the
    documents of every task in lm-eval's order, the lm-eval `Task` objects
    by name (`process_results`, filters, `aggregation`, `higher_is_better`),
    and for a group its lm-eval `Group`s by name (`aggregate`), `group` the
    one named."""

    name: str
    output_type: str
    docs: tuple[DocRequests, ...]
    tasks: Mapping[str, Any]
    num_fewshot: Mapping[str, int]
    groups: Mapping[str, Any] = field(default_factory=dict)
    group: str | None = None

    @property
    def grouped(self) -> bool:
        """A group or tag: instance ids and metric names carry the subtask."""
        return len(self.tasks) > 1 or bool(self.groups)


def task_label(spec: str) -> str:
    return f"lm-eval task {spec!r}"


def load(
    spec: str,
    include_path: Sequence[Path],
    num_fewshot: int | None,
    limit: float | None,
    fewshot_seed: int | None,
    chat: Chat,
) -> Loaded:
    """Find, build and check the task; EvalReplayError naming it otherwise."""
    where = task_label(spec)
    try:
        from lm_eval.tasks import TaskManager
    except ImportError as exc:
        raise EvalReplayError(
            f"{where}: EvalTask.from_lm_eval needs lm-evaluation-harness, which does not import here "
            f"({type(exc).__name__}: {exc}); install it with {EXTRA}"
        ) from None
    logging.getLogger("lm_eval").setLevel(logging.ERROR)  # its per-task INFO/WARNING chatter
    for p in include_path:
        if not p.is_dir() and not p.is_file():
            raise EvalReplayError(
                f"{where}: include_path {str(p)!r} does not exist; "
                "give the folder that holds your task YAML files"
            )
    # lm-eval's and datasets' progress bars write to stderr while pytest collects.
    with contextlib.redirect_stderr(io.StringIO()), compiled_templates():
        found = _find(TaskManager, spec, include_path, where)
        tasks, groups, top = _members(found, spec, where)
        for name, task in tasks.items():
            here = f"{where} (task {name!r})" if len(tasks) > 1 else where
            _refuse_unservable(task, here)
            _configure(task, num_fewshot, fewshot_seed)
            _build(task, limit, chat, here)
    kinds = sorted({t.OUTPUT_TYPE for t in tasks.values()})
    if len(kinds) > 1:
        raise EvalReplayError(
            f"{where}: its tasks mix output types ({', '.join(kinds)}); EvalTask.from_lm_eval asks one kind "
            "of request per task: give each task (or a group of one output type) its own from_lm_eval(...)"
        )
    docs = tuple(d for name, task in tasks.items() for d in _documents(task, name, where))
    shots = {name: int(task.config.num_fewshot or 0) for name, task in tasks.items()}
    name = top if top is not None else (next(iter(tasks)) if len(tasks) == 1 else spec)
    return Loaded(name, kinds[0], docs, tasks, shots, groups, top)


def _members(
    found: Mapping[str, Any], spec: str, where: str
) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """The leaf tasks (in lm-eval's order), the groups by name, and the
    group the spec names (None for a task or a tag, which has no aggregate)."""
    tasks, groups = dict(found.get("tasks", {})), dict(found.get("groups", {}))
    if not tasks:
        raise EvalReplayError(
            f"{where}: lm-eval found no tasks under that name; check the group's task: list"
        )
    children = {c for g in groups.values() for c in g.child_names}
    tops = [g for g in groups if g not in children]
    top = spec if spec in groups else (tops[0] if len(tops) == 1 else None)
    return tasks, groups, top


@functools.lru_cache(maxsize=1024)
def _compile_once(template: str) -> Any:
    """A template text compiled in lm-eval's jinja environment, kept for the
    process (every document and every answer scored renders the same few)."""
    from lm_eval import utils

    return utils.env.from_string(template)


@contextlib.contextmanager
def compiled_templates() -> Iterator[None]:
    """lm-eval compiles a jinja template again on every render
    (`lm_eval.utils.apply_template`: about 8 per document, nearly all of its
    CPU per request); while this is open each template text is compiled once,
    in lm-eval's own environment, so the rendered strings are the same."""
    from lm_eval import utils

    original = utils.apply_template
    if getattr(original, "compiled_once", False):
        yield  # already open (a nested use)
        return

    def apply_template(template: str, doc: dict[str, Any]) -> str:
        return _compile_once(template).render(**doc)

    apply_template.compiled_once = True  # type: ignore[attr-defined]
    utils.apply_template = apply_template
    try:
        yield
    finally:
        utils.apply_template = original


def _build(task: Any, limit: float | None, chat: Chat, where: str) -> None:
    """Every document's context and requests, by `Task.build_all_requests`
    (few-shot examples drawn in document order, as lm-eval draws them)."""
    from lm_eval.evaluator_utils import get_sample_size

    try:
        task.build_all_requests(
            limit=get_sample_size(task, limit),
            rank=0,
            world_size=1,
            system_instruction=chat.system_instruction,
            apply_chat_template=chat.apply_chat_template,
            fewshot_as_multiturn=chat.multiturn,
            chat_template=_messages if chat.apply_chat_template else None,
        )
    except Exception as exc:
        raise EvalReplayError(
            f"{where}: lm-eval could not build the task's requests ({type(exc).__name__}: {_short(exc)}); "
            "check its doc_to_text / doc_to_target / doc_to_choice and few-shot settings with "
            "`lm_eval --tasks ... --limit 1 --write_out`"
        ) from None


def _find(manager_cls: Any, spec: str, include_path: Sequence[Path], where: str) -> Mapping[str, Any]:
    """What `spec` names (a task, a group or a tag), as `TaskManager.load`
    gives it. Tried first with the user's folders alone (indexing lm-eval's
    hundreds of built-in tasks costs seconds), then with lm-eval's own too."""
    paths = [str(p) for p in include_path]
    loaded: Any = None
    attempts = [False, True] if paths or Path(spec).suffix in (".yaml", ".yml") else [True]
    for defaults in attempts:
        try:
            manager = manager_cls(include_path=paths or None, include_defaults=defaults)
            loaded = manager.load(spec)
            break
        except KeyError:
            continue
        except Exception as exc:
            raise EvalReplayError(_load_failure(where, exc)) from None
    if loaded is None:
        looked = f" (looked in include_path={paths} and lm-eval's own tasks)" if paths else ""
        raise EvalReplayError(
            f"{where}: lm-eval knows no task, group or tag of that name{looked}; check the name "
            "(`lm_eval ls tasks` lists them), or give include_path= the folder of your task YAML, "
            "or the path of the YAML file itself"
        )
    return loaded


def _load_failure(where: str, exc: BaseException) -> str:
    text = _short(exc)
    if "datasets" in type(exc).__module__ or isinstance(exc, (FileNotFoundError, ConnectionError, OSError)):
        return (
            f"{where}: its dataset could not be loaded ({type(exc).__name__}: {text}); a hub dataset needs "
            "network access or the Hugging Face cache (HF_DATASETS_OFFLINE=1 reads the cache only); a local "
            "one needs dataset_path: json and dataset_kwargs: {data_files: ...} naming files that exist"
        )
    return f"{where}: lm-eval could not load the task ({type(exc).__name__}: {text}); check its YAML"


def _short(exc: BaseException) -> str:
    """The exception's message, with its cause's (datasets wraps the real one)."""
    text = " ".join(str(exc).split())
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause) and str(cause) not in text:
        text += f" <- {type(cause).__name__}: " + " ".join(str(cause).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _refuse_unservable(task: Any, where: str) -> None:
    """Output types and features the plugin cannot serve, refused by name."""
    kind = getattr(task, "OUTPUT_TYPE", None)
    if kind not in SERVED:
        raise EvalReplayError(
            f"{where}: output_type {kind!r} is not supported by EvalTask.from_lm_eval (it serves "
            f"{', '.join(SERVED)}); run this task with lm_eval itself"
        )
    if getattr(task, "MULTIMODAL", False):
        raise EvalReplayError(
            f"{where}: the task sends images or audio (doc_to_image / doc_to_audio), which "
            "EvalTask.from_lm_eval does not serve; run it with lm_eval's multimodal models"
        )
    if getattr(task, "UNSAFE_CODE", False):
        raise EvalReplayError(
            f"{where}: the task is marked unsafe_code (it runs model-written code); "
            "EvalTask.from_lm_eval does not run such tasks"
        )
    repeats = getattr(task.config, "repeats", 1) or 1
    if repeats != 1:
        raise EvalReplayError(
            f"{where}: repeats: {repeats}; lm-eval's filters see all repeats of a document at once "
            "(majority vote), which EvalTask.from_lm_eval does not do yet: set repeats: 1"
        )
    from lm_eval.api import metrics

    known = [getattr(metrics, name) for name in AGGREGATIONS]
    for metric, fn in task.aggregation().items():
        if not any(fn is k for k in known):
            agg = getattr(fn, "__name__", repr(fn))
            raise EvalReplayError(
                f"{where}: metric {metric!r} aggregates with {agg!r}; EvalTask.from_lm_eval supports "
                f"metrics aggregated by {', '.join(AGGREGATIONS)} (acc, exact_match, word_perplexity, ...)"
            )


def _configure(task: Any, num_fewshot: int | None, fewshot_seed: int | None) -> None:
    """As `lm_eval.simple_evaluate` does: num_fewshot overrides the YAML's
    unless the YAML sets 0; unset means 0; the few-shot sampler's seed."""
    if num_fewshot is not None:
        if task.get_config("num_fewshot") != 0:
            task.set_config(key="num_fewshot", value=num_fewshot)
    elif task.get_config("num_fewshot") is None:
        task.set_config(key="num_fewshot", value=0)
    task.set_fewshot_seed(seed=fewshot_seed)


def _messages(history: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[dict[str, Any]]:
    """A chat template that keeps the messages, as lm-eval's chat API models
    do: the request's context is the chat messages themselves."""
    return [dict(m) for m in history]


def _context(value: Any) -> Context:
    return [dict(m) for m in value] if isinstance(value, list) else value


def _documents(task: Any, name: str, where: str) -> tuple[DocRequests, ...]:
    """Each document's requests, as build_all_requests made them."""
    by_doc: dict[int, list[Any]] = {}
    for inst in task.instances:
        by_doc.setdefault(inst.doc_id, []).append(inst)
    out = []
    for doc_id, instances in by_doc.items():
        instances.sort(key=lambda i: i.idx)
        first = instances[0]
        if task.OUTPUT_TYPE == "generate_until":
            context, gen_kwargs = first.args[0], first.args[1]
            out.append(
                DocRequests(doc_id, first.doc, _context(context), gen_kwargs=dict(gen_kwargs), task=name)
            )
            continue
        if task.OUTPUT_TYPE == "loglikelihood_rolling":
            # The whole text, its log-likelihood over rolling windows of the model's context.
            out.append(DocRequests(doc_id, first.doc, first.args[0], task=name, rolling=True))
            continue
        contexts = {inst.args[0] for inst in instances}
        if len(contexts) != 1:
            raise EvalReplayError(
                f"{where}: document {doc_id} asks log-likelihoods after {len(contexts)} different contexts "
                "(multiple inputs, as winogrande, or acc_mutual_info); EvalTask.from_lm_eval scores "
                "continuations of one context per document"
            )
        context = _context(first.args[0])
        if not isinstance(context, str):
            raise EvalReplayError(
                f"{where}: apply_chat_template=True with a {task.OUTPUT_TYPE} task: log-likelihoods are "
                "scored after a text prompt; leave apply_chat_template off for this task"
            )
        out.append(
            DocRequests(doc_id, first.doc, context, tuple(inst.args[1] for inst in instances), task=name)
        )
    return tuple(out)


def json_doc(doc: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A document as lm-eval's `--log_samples` writes its `doc`: JSON, what
    JSON has no type for converted by lm-eval's own `handle_non_serializable`
    (numpy numbers as numbers, sets as lists, anything else as its str).
    What orjson cannot write is kept readable rather than failing the run
    dir: an int past 64 bits as its digits, a lone surrogate as "?"."""
    from lm_eval.utils import handle_non_serializable

    try:
        data = orjson.dumps(dict(doc), default=handle_non_serializable, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # orjson's JSONEncodeError: lm-eval's own json.dumps writes such a document
        try:
            text = json.dumps(dict(doc), default=handle_non_serializable, ensure_ascii=False)
        except ValueError as exc:  # a circular reference
            raise EvalReplayError(f"{where}: its document cannot be saved as JSON ({exc})") from None
        text = text.encode("utf-8", "replace").decode("utf-8")
        return json.loads(text, parse_int=_int64_or_digits, parse_constant=lambda _: None)  # type: ignore[no-any-return]
    return orjson.loads(data)  # type: ignore[no-any-return]


def _int64_or_digits(digits: str) -> int | str:
    value = int(digits)
    return value if -(2**63) <= value < 2**64 else digits


def sampling(gen_kwargs: Mapping[str, Any], seed: int | None, chat: bool) -> dict[str, Any]:
    """A generate_until request's sampling as lm-eval's `local-completions`
    (or `local-chat-completions`, `chat`) sends it: max_gen_toks as
    max_tokens (256 unset), temperature 0 unset, `until` as stop, do_sample
    dropped, the rest passed on, and lm-eval's seed."""
    kwargs = dict(gen_kwargs)
    kwargs.pop("do_sample", None)
    out: dict[str, Any] = {
        "max_tokens": kwargs.pop("max_tokens", kwargs.pop("max_gen_toks", DEFAULT_MAX_GEN_TOKS)),
        "temperature": kwargs.pop("temperature", 0),
    }
    until = kwargs.pop("until", None)
    until = [until] if isinstance(until, str) else list(until or [])
    if until:
        out["stop"] = until[:4] if chat else until  # local-chat-completions sends four at most
    if seed is not None:
        out["seed"] = seed
    out.update(kwargs)
    return out
