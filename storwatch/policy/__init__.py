"""Policy: the rules that turn findings into actions. A home only, for now: nothing here runs yet.

What will live here: the rule schema (a YAML file of data, loaded with ``yaml.safe_load`` and validated with errors
that name file, line and field, the last good rules kept on a bad reload); the evaluation of a rule's condition over
the facts and findings of the View (``storwatch.analysis``); and the engine that, on its own worker, queues the
actions a rule names (``storwatch.actions``: a Kubernetes Event, a checkpoint request, a sync copy, a webhook), with
each rule's rate limit, and reports what it did and what failed.
"""
