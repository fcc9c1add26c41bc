"""The HTTP server around the app: ``http_guard`` (uvicorn's protocol with header bounds, deadlines
and a connection cap), ``process`` (the serving process: uvicorn's server, gc tuned once started),
``forwarded`` (uvicorn's ``X-Forwarded-*`` handling, where the app applies it)."""
