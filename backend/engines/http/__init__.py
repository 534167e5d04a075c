"""Engines that are HTTP servers streaming SSE: SGLang's native API, OpenAI-compatible, SGLang's launcher."""
