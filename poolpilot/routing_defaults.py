"""Routing defaults the router and the API share (the core may not import the router)."""

# Late binding's threshold (router/prefill_hold.py): enough queued work to keep a prefill
# engine busy between the router's releases (each within milliseconds of a prefill's end),
# little enough that a burst's queue stays at the router for the replicas that join while it
# lasts. Simulated seconds; the simulated router (engine_sim/des.py) uses the same.
DEFAULT_PREFILL_HOLD_S = 1.0
