"""The pure engine: the rule book and what it stands on. Standard library only; it runs unchanged under CPython and Pyodide, and imports nothing from api/, store/, doors/, client/ or cli/."""
