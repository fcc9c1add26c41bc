"""The conversation: a neutral model of it, one codec per API, its canonical form and chain hashes.

- ``model``: items, pairing groups, parts, opaque rules (what the defenses and the projection read);
- ``codec``: the ``Codec`` contract; ``chat_codec`` (chat completions, live), ``messages_codec``
  (Anthropic Messages, a first version for issue 19);
- ``canonical``: the canonical form of a message, digests and chain hashes; ``digest_memo``: their
  memo (``DigestMemo``);
- ``prefix``: the per-conversation prefix state (one lookback by chain hash for every consumer);
- ``chat_request``: parsing and checking a chat-completions body.
"""
