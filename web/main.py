"""PyScript entry point: say that the runtime is up, then import the engine and the UI (app.py). Inside
another page's frame nothing starts: boot.js has said why on the loading card."""

import js

if not js.MP.framedRefused:
    js.MP.stage("engine", "Importing the protocol engine…")
    try:
        import app

        await app.main()  # noqa: F704 - PyScript runs the main script with top-level await
    except Exception as exc:  # shown on the loading card, never a page that pretends to be ready
        js.MP.fatal(f"{type(exc).__name__}: {exc}")
        raise
