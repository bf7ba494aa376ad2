"""The rules: plain functions `rule(core, tx, ...)` that read through a Tx and stage their changes in it (monitors, publishing, delivery, leases, upkeep, import), and what several of them share."""
