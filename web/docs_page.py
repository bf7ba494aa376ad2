"""PyScript entry point of the docs pages (docs/*.html): the runtime is up; import the page (docs_ui.py).

No top-level await (the build precompiles every web/*.py but main.py as a plain module): the page's start
is scheduled on PyScript's running loop, and a failure is shown on the loading strip."""

import asyncio

import js

js.MP.stage("engine", "Importing the protocol engine…")


async def start() -> None:
    try:
        import docs_ui

        await docs_ui.main()
    except Exception as exc:  # shown on the loading strip, never a page that pretends to be ready
        js.MP.fatal(f"{type(exc).__name__}: {exc}")
        raise


STARTED = asyncio.ensure_future(start())
