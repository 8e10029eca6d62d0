"""Speculative decoding: proposers (draft model, n-gram), verification under each request's
adapter, adaptive k and the acceptance figures."""
