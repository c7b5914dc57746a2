"""The runtimes: the in-process model (GGUF inspection, chat formats, llama.cpp
generation) and a model behind a server, both with the interface written down in
:mod:`.protocol`. Import the module you need (``runtime.model``, ``runtime.remote``, …);
this package re-exports nothing, so importing one module loads only what it needs.

Importing this package does not import llama_cpp (``model`` imports it lazily).
"""
