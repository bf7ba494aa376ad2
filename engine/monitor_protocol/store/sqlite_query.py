"""A LogQuery as SQLite SQL: the WHERE clause of a filtered log read (every value a parameter) and the index
the read must use (`INDEXED BY`, chosen here rather than left to the planner, whose guess on a skewed log can
turn a bounded read into a full scan)."""

from __future__ import annotations

import functools
from typing import Any

from monitor_protocol.core.store_contract import LOG_COLUMNS, SEEK_COLUMNS, LogQuery, Term
from monitor_protocol.store.sql import next_prefix, storable


def source_of(query: LogQuery | None) -> str:
    index = log_index(query)
    return "observations" if index is None else f"observations INDEXED BY {index}"


def _term_sql(term: Term, params: list[Any], plain: bool) -> str:
    if term.column not in LOG_COLUMNS:  # a column name goes into SQL text: only the known ones
        raise ValueError(f"not an indexed log column: {term.column!r}")
    col = f"+{term.column}" if plain else term.column
    parts: list[str] = []
    exact = [v for v in term.exact if storable(v)]
    if exact:
        parts.append(f"{col} IN ({', '.join('?' * len(exact))})")
        params.extend(exact)
    for prefix in term.prefixes:
        if not storable(prefix):
            continue
        upper = next_prefix(prefix)
        if upper is None:
            parts.append(f"{col} >= ?")  # "" or only U+10FFFF: every value from it up starts with it
            params.append(prefix)
        else:
            parts.append(f"({col} >= ? AND {col} < ?)")
            params.extend((prefix, upper))
    return " OR ".join(parts) if parts else "0"


# The log columns with an index of their own, `(monitor, column, seq)`.
INDEXED_COLUMNS = SEEK_COLUMNS


def log_where(query: LogQuery | None, *, plain: bool = False) -> tuple[str, list[Any]] | None:
    """The query as a SQL condition on the log's columns and its parameters, or None when it lets every
    row through. Clauses AND, alternatives OR, an alternative's terms AND, a term's values OR (a NULL
    subject fails every comparison, as Term.holds says). `plain` writes each column as `+column`, which
    no index can serve: the condition is then only tested on rows, and the seek is left to another term."""
    if query is None or query.selects_all:
        return None
    cond, params = _log_where(query, plain)
    return cond, list(params)


@functools.lru_cache(maxsize=1024)
def _log_where(query: LogQuery, plain: bool) -> tuple[str, tuple[Any, ...]]:
    """log_where, remembered: a query is a frozen value, and every pull of a subscription asks the same."""
    params: list[Any] = []
    clauses: list[str] = []
    for clause in query.clauses:
        if any(not alt for alt in clause):
            continue  # an empty alternative holds always: this clause lets everything through
        alts = [" AND ".join(f"({_term_sql(t, params, plain)})" for t in alt) for alt in clause]
        clauses.append(" OR ".join(f"({a})" for a in alts) if alts else "0")
    return " AND ".join(f"({c})" for c in clauses), tuple(params)


def seekable_terms(query: LogQuery) -> list[Term]:
    """The terms that must hold for every row (each term of a clause with one alternative) and are on a
    column with its own index: a read may seek that index on their values."""
    return [
        term
        for clause in query.clauses
        if len(clause) == 1
        for term in clause[0]
        if term.column in INDEXED_COLUMNS
    ]


def log_index(query: LogQuery | None) -> str | None:
    """The index a filtered read must seek, named to SQLite (INDEXED BY) rather than left to its planner:
    without statistics it prefers the primary key's seq range, and with averaged ones (ANALYZE) it would
    still read a million rows to find a rare type. A seekable term that lists exact values only (each value
    one seek; a prefix range would walk the whole range whatever the seqs) with the fewest values wins.
    None: no such term (see SQLiteStore._expand for prefixes), the planner chooses."""
    if query is None:
        return None
    return _log_index(query)


@functools.lru_cache(maxsize=1024)
def _log_index(query: LogQuery) -> str | None:
    exact = [t for t in seekable_terms(query) if not t.prefixes and any(storable(v) for v in t.exact)]
    if not exact:
        return None
    return f"observations_by_{min(exact, key=lambda t: len(t.exact)).column}"
