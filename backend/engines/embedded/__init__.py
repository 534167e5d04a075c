"""The embedded engine: a Llama (the bundled SmolLM2-135M-Instruct) on this machine's CPU.

`engine` is the asyncio side the backend talks to (EmbeddedEngine); the model and its scheduler run
in a process of their own (`worker`, `child`, `scheduler`, `model`); `compute` says which compute
path that process runs and whether it is batch-invariant; `linear`, `quantized`, `decode_ops` and
`pages` are the parts of a step that the C kernels speed up. Importing this package imports nothing
else, so the command line can read `compute`'s choices without loading torch.
"""
