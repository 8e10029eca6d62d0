"""The model runtime: a Llama-family model from a Hugging Face folder, run over a paged batch."""
