"""Text helpers shared by the text tasks (lm, summarization, tts): the tokenizer
(`tokenizer`), tokenized splits cached on disk and memory-mapped (`token_cache`) and
the standard library's docstrings as the default corpus (`corpus`)."""
