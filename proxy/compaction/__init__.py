"""The defenses' async shell: what the chat use case (``proxy.forward``) asks before each forward.

- ``base``: the interface the pipeline calls (``CompactionInput`` in, ``Prepared`` out) and the
  pass-through ``Compactor``;
- ``compactor``: ``ProjectingCompactor``, the I/O shell (window, events, artifacts, locks, learning);
- ``plan_loop``: the plan loop (project, store, execute, project again; own tools; the forwarded
  bytes), the same for the live proxy and ``proxy.offline.replay``;
- ``summarizer``: summaries of a ``SummaryPlan`` chunk by chunk, and the provider's summary client;
- ``references``: does a request name stored content (``ReferenceMemo``); ``offer``: which of the
  proxy's tools a request carries;
- ``limits``, ``models``, ``overflow``: learned limits, model profiles, providers' overflow errors.

Never imports ``proxy.forward``. State (all per instance, built by ``ProjectingCompactor``, one per
app): see each class's docstring for its bound.
"""
