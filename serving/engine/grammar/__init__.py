"""Constrained decoding: per-row grammars (xgrammar) and the token masks they put on logits."""
