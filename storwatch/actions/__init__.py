"""Actions: everything storwatch does that changes the world rather than observes it.

Today: posting Kubernetes Events about findings (:mod:`.kube_events`). To come here too: emergency checkpoint requests
to a training process, verified copies of the newest checkpoint from ephemeral to durable storage, webhooks.

Sources stay read-only; an action is called by the policy engine (``storwatch.policy``) on its own worker, never from
a source or a scrape. Each action bounds its own rate and time, and a failed action is reported, never raised into
its caller's loop. An action that touches a mount (a sync copy) goes through ``storwatch.blocking``, like every call
that can hang in the kernel.
"""
