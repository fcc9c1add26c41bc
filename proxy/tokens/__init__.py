"""Token counting: ``counter`` (tiktoken, or its byte estimate), ``media`` (images, audio, files),
``protocol`` (what the defenses and the projection need of a counter)."""
