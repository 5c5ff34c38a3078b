"""The two-stage tokenizer: first stage (tiktoken BPE and its trainer), second stage, artifact."""
