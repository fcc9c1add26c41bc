"""The defenses of DESIGN.md section 2, each a pure function (no I/O, no clock, no randomness).

- ``truncate_args``: defense 1, shorten old file-writing tool-call arguments (valid JSON kept);
- ``offload``: defense 2, large tool results / user messages become stubs over artifacts;
- ``media``: inline images become references to artifacts (summarized history, body-size overflow);
- ``summarize``: defense 3, the summary request and the summary message (the pipeline calls the model);
- ``overflow_clip``: defense 4's last resort, clip the oversized trailing tool results in place;
- ``pairs``: tool-call pair safety and synthetic answers for dangling calls;
- ``cutoff``: where a summary cuts; ``config``: thresholds; ``plans``: events to perform.

``proxy.projection.project`` folds stored events and these defenses over a request.
"""
