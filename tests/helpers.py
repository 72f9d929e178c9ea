"""Small test utilities that are not fixtures."""

import contextlib


@contextlib.contextmanager
def token_embeddings_replaced_by(model, embeddings):
    """Make CLIP's own ``encode_text`` read ``embeddings`` instead of its token-embedding lookup."""
    handle = model.token_embedding.register_forward_hook(lambda module, args, output: embeddings)
    try:
        yield
    finally:
        handle.remove()
