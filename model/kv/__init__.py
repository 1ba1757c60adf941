"""KV cache: block pools with prefix caching and eviction, and KV events."""
