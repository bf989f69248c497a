"""lm-evaluation-harness's tasks as `EvalTask`s (`EvalTask.from_lm_eval`):
lm-eval builds the documents, prompts, few-shot contexts and requests, and
scores the answers with its own filters, `process_results` and aggregation;
the plugin asks the provider, journals, resumes, replays and gates. lm-eval
is imported only when such a task is collected (docs/lm_eval.md)."""
