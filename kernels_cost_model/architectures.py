"""Which vLLM model class runs a checkpoint, and where that class puts the embedding and LM head
under pipeline parallelism.

A ModelSpec's `architecture` is its Hugging Face config's `architectures[0]` (vLLM picks its model
class by it), else the class its `model_type` names; "" where neither is known (a bare config.json),
which is placed as the Llama family is.

Under PP vLLM's model files place the input embedding, the final norm and the LM head one of two ways
(vllm/model_executor/models/, checked 2026-11-27):

- ends (`END_STAGES`): the embedding on the first rank, or on the last too with tied embeddings; the
  final norm and LM head on the last rank only, PPMissingLayer elsewhere. llama.py `LlamaModel.__init__`
  (`get_pp_group().is_first_rank or (config.tie_word_embeddings and get_pp_group().is_last_rank)`) and
  `LlamaForCausalLM.__init__` (`lm_head` only `if get_pp_group().is_last_rank`; Mistral runs on it, and
  llama4.py's `Llama4Model` / `Llama4ForCausalLM` subclass them); qwen2.py `Qwen2Model` /
  `Qwen2ForCausalLM` the same (qwen3.py's classes subclass them); deepseek_v2.py `DeepseekV2Model`
  (`embed_tokens` on the first rank, `norm` on the last) and `DeepseekV2ForCausalLM` (`lm_head` on the
  last; DeepseekV3ForCausalLM subclasses it).
- every stage (`EVERY_STAGE`): the model builds `embed_tokens`, `norm` and `lm_head` unconditionally,
  so each PP rank holds a whole (vocabulary-parallel) embedding and LM head, one table when tied, though
  only the first embeds and only the last computes logits. mixtral.py `MixtralModel.__init__` /
  `MixtralForCausalLM.__init__`; qwen3_moe.py `Qwen3MoeModel` / `Qwen3MoeForCausalLM`; gpt_oss.py
  `GptOssModel` (`self.embedding`) / `GptOssForCausalLM`; gemma3.py `Gemma3Model` (`embed_tokens`,
  also its tied LM head; gemma3_mm.py wraps Gemma3ForCausalLM); qwen3_next.py `Qwen3NextModel` /
  `Qwen3NextForCausalLM`.
"""
from __future__ import annotations

END_STAGES = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Llama4ForCausalLM",
                        "Llama4ForConditionalGeneration", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                        "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"})
EVERY_STAGE = frozenset({"MixtralForCausalLM", "Qwen3MoeForCausalLM", "GptOssForCausalLM", "Gemma3ForCausalLM",
                         "Gemma3ForConditionalGeneration", "Qwen3NextForCausalLM"})

_OF_MODEL_TYPE = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                  "llama4": "Llama4ForConditionalGeneration",
                  "llama4_text": "Llama4ForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                  "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
                  "mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "gpt_oss": "GptOssForCausalLM",
                  "gemma3": "Gemma3ForConditionalGeneration", "gemma3_text": "Gemma3ForCausalLM",
                  "qwen3_next": "Qwen3NextForCausalLM"}


def architecture_of(cfg: dict) -> str:
    """vLLM's model class for a config.json dict: `architectures[0]`, else its (or its text_config's)
    `model_type`'s class; "" if unknown."""
    names = cfg.get("architectures")
    if isinstance(names, list) and names and isinstance(names[0], str):
        return names[0]
    text = cfg.get("text_config")
    kinds = [cfg.get("model_type"), text.get("model_type") if isinstance(text, dict) else None]
    return next((_OF_MODEL_TYPE[k] for k in kinds if isinstance(k, str) and k in _OF_MODEL_TYPE), "")


def ends_on_every_stage(architecture: str) -> bool:
    """Whether vLLM's model class builds the embedding, final norm and LM head on every PP rank."""
    return architecture in EVERY_STAGE
