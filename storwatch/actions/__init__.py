"""Actions: everything storwatch does that changes the world rather than observes it.

What a policy rule can do (:mod:`.registry` names them, :mod:`.base` holds the types they share with the policy
engine): ``log`` (:mod:`.log`), ``event`` (:mod:`.event`, over the Events writer :mod:`storwatch.kube.events`),
``webhook`` (:mod:`.webhook`), ``request_checkpoint`` (:mod:`.checkpoint_request`, with :mod:`.request_file` in its
helper process :mod:`._request_worker`); :mod:`.runner` runs them on lanes (a webhook's per receiver), each request
spending its action's, its rule's and its owner's budget (token buckets of :mod:`storwatch.pace`, which the Events
writer uses too). Every file named for a credential is read through :mod:`.secret_file`.

Sources stay read-only; an action is called by the policy engine (``storwatch.policy``) on its own worker, never from
a source or a scrape. Each action bounds its own rate and time, and a failed action is reported, never raised into
its caller's loop. An action that touches a mount (a sync copy) goes through ``storwatch.calls``, like every call that
can hang in the kernel.
"""
