"""Failure diagnosis from training logs (Acme section 6.1): template-mined log compression and an ordered rule base
that names the root cause, the failing rank or node, whether a restart can help, and what to do."""
