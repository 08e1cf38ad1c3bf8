"""The request parameters providers document, by provider: names a model setting may
have that the near-miss check of ``littleghost.settings`` never refuses, however close
they are to a setting littleghost knows (vLLM's ``min_tokens`` to ``max_tokens``)."""

from __future__ import annotations

__all__ = [
    "ANTHROPIC_SETTINGS",
    "FOREIGN_SETTINGS",
    "LLAMA_CPP_SETTINGS",
    "OPENAI_SETTINGS",
    "PROVIDER_SETTINGS",
    "WHOSE",
]

_OPENAI = """
    audio frequency_penalty function_call functions logit_bias logprobs
    max_completion_tokens max_tokens metadata modalities moderation n parallel_tool_calls
    prediction presence_penalty prompt_cache_key prompt_cache_options
    prompt_cache_retention reasoning_effort response_format safety_identifier seed
    service_tier stop store stream_options temperature tool_choice top_logprobs top_p user
    verbosity web_search_options
"""
_ANTHROPIC = """
    betas cache_control container context_management diagnostics inference_geo max_tokens
    mcp_servers metadata output_config output_format service_tier speed stop_sequences
    temperature thinking tool_choice top_k top_p user_profile_id workspace_id
"""
_LLAMA_CPP = """
    add_generation_prompt cache_prompt chat_template_kwargs continue_final_message
    dry_allowed_length dry_base dry_multiplier dry_penalty_last_n dry_sequence_breakers
    dynatemp_exponent dynatemp_range frequency_penalty grammar id_slot ignore_eos
    json_schema logit_bias lora min_keep min_p mirostat mirostat_eta mirostat_tau
    n_cache_reuse n_cmpl n_indent n_keep n_predict n_probs parse_tool_calls
    post_sampling_probs presence_penalty reasoning_format repeat_last_n repeat_penalty
    response_fields return_progress return_tokens samplers seed sse_ping_interval stop
    t_max_predict_ms temperature timings_per_token top_k top_n_sigma top_p typical_p
    xtc_probability xtc_threshold
"""
_VLLM = """
    add_generation_prompt add_special_tokens allowed_token_ids bad_words best_of
    cache_salt chat_template chat_template_kwargs continue_final_message documents echo
    guided_choice guided_decoding_backend guided_grammar guided_json guided_regex
    guided_whitespace_pattern ignore_eos include_stop_str_in_output kv_transfer_params
    length_penalty logits_processors media_io_kwargs min_p min_tokens mm_processor_kwargs
    priority prompt_logprobs repetition_detection repetition_penalty request_id
    return_token_ids return_tokens_as_token_ids skip_special_tokens
    spaces_between_special_tokens stop_token_ids structural_tag structured_outputs
    thinking_token_budget top_k truncate_prompt_tokens use_beam_search vllm_xargs
"""

OPENAI_SETTINGS = frozenset(_OPENAI.split())
"""The request parameters of OpenAI's chat completions."""
ANTHROPIC_SETTINGS = frozenset(_ANTHROPIC.split())
"""The request parameters of Anthropic's messages."""
LLAMA_CPP_SETTINGS = frozenset(_LLAMA_CPP.split())
"""The request parameters of the llama.cpp server's documentation (``/completion``'s
options, which its chat completions take too)."""

PROVIDER_SETTINGS = frozenset((_OPENAI + _ANTHROPIC + _LLAMA_CPP + _VLLM).split())
"""The request parameters of OpenAI's chat completions, Anthropic's messages, the
llama.cpp server's and vLLM's documentation (as of late 2026)."""

_TAKERS = ((_ANTHROPIC, "Anthropic's"), (_LLAMA_CPP, "llama.cpp's"), (_VLLM, "vLLM's"))
WHOSE = {
    name: " and ".join(whose for names, whose in _TAKERS if name in names.split())
    for name in PROVIDER_SETTINGS - OPENAI_SETTINGS
}
"""Whose parameter a name of ``PROVIDER_SETTINGS`` that OpenAI's API does not take is
(``"vLLM's"``), for an error that names it."""

FOREIGN_SETTINGS = {
    "temp": ("temperature", "llama.cpp's command-line name"),
    "max_new_tokens": ("max_tokens", "the name of Hugging Face's TGI and transformers"),
    "max_length": ("max_tokens", "the name of Hugging Face's transformers and KoboldCpp"),
    "num_predict": ("max_tokens", "an option of Ollama's own API"),
    "max_output_tokens": ("max_tokens", "the name of Gemini's API and OpenAI's Responses"),
    "max_tokens_to_sample": ("max_tokens", "the name of Anthropic's old completions API"),
}
"""Names other libraries and APIs give a setting that every provider littleghost sends to
(OpenAI's chat completions and the servers compatible with it, Anthropic's messages)
names otherwise, none of them taking the name: the setting meant, and whose name it is."""
