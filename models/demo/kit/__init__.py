"""The demo kit's build steps: corpus, tokenizer, training, transformations and evaluation."""
